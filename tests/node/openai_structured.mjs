// The official OpenAI Node SDK's structured output helpers (tests/integration/test_constrain.py): argv BASE_URL MODEL [SEEDS].
// zodResponseFormat with beta.chat.completions.parse and beta.chat.completions.stream; every parsed object must pass the zod schema.
// Prints one JSON line: the versions, the schema the helper sent, and per seed the parsed objects and finish reasons.
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";

const [baseURL, model, seedList] = process.argv.slice(2);
const seeds = (seedList ?? "1,2").split(",").map(Number);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const version = (p) => JSON.parse(readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url))).version;

// string, integer, enum, array of strings, nested object, nullable fields (a string and an object)
const Pet = z.object({
  name: z.string().max(12),
  age: z.number().int(),
  kind: z.enum(["cat", "dog", "bird"]),
  tags: z.array(z.string().max(6)).max(3),
  owner: z.object({ city: z.string().max(10), verified: z.boolean() }),
  nickname: z.string().nullable(), // the helper writes {"type":"string","nullable":true}
  vet: z.object({ visits: z.number().int() }).nullable(), // anyOf [object, null]
});
const format = zodResponseFormat(Pet, "pet");
const messages = [{ role: "user", content: "Describe a pet as JSON." }];
const body = (seed) => ({ model, messages, seed, temperature: 1, max_tokens: 2000, response_format: format });
const out = { openai: version("openai"), zod: version("zod"), schema: format.json_schema.schema, parsed: [], streamed: [] };

for (const seed of seeds) {
  // parse: the SDK parses message.content with the schema (it throws on a length cut)
  const r = await client.beta.chat.completions.parse(body(seed));
  const msg = r.choices[0].message;
  out.parsed.push({ seed, finish: r.choices[0].finish_reason, content: msg.content, parsed: msg.parsed, zod: Pet.safeParse(msg.parsed).success });

  // stream: content deltas arrive as chunks, the final completion carries the parsed object
  const stream = client.beta.chat.completions.stream(body(seed));
  let deltas = 0;
  for await (const chunk of stream) deltas += chunk.choices[0]?.delta?.content ? 1 : 0;
  const fin = await stream.finalChatCompletion();
  const fm = fin.choices[0].message;
  out.streamed.push({ seed, finish: fin.choices[0].finish_reason, deltas, content: fm.content, parsed: fm.parsed, zod: Pet.safeParse(fm.parsed).success });
}
console.log(JSON.stringify(out));
