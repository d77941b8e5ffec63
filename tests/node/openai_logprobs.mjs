// The official OpenAI Node SDK asks for top_logprobs and n (tests/integration/test_logprobs.py): argv BASE_URL MODEL.
// Prints one JSON line: chat top_logprobs (streamed and not), completions logprobs, n = 3 choices.
import { readFileSync } from "node:fs";
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const messages = [{ role: "user", content: "The cat" }];
const version = JSON.parse(readFileSync(new URL("./node_modules/openai/package.json", import.meta.url))).version;
const out = { version };

const chat = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 5 });
out.chat = chat.choices[0].logprobs.content.map((c) => ({ token: c.token, logprob: c.logprob, bytes: c.bytes, top: c.top_logprobs.map((t) => [t.token, t.logprob]) }));

const stream = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 5, stream: true });
out.streamed = [];
for await (const chunk of stream)
  for (const ch of chunk.choices) for (const c of ch.logprobs?.content ?? []) out.streamed.push({ token: c.token, logprob: c.logprob });

const cmpl = await client.completions.create({ model, prompt: "The cat", max_tokens: 3, temperature: 0, logprobs: 2 });
out.completion = cmpl.choices[0].logprobs;

const greedy = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, n: 3 });
out.greedy = greedy.choices.map((c) => [c.index, c.message.content]);
const seeded = [];
for (let i = 0; i < 2; i++) {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, temperature: 1, seed: 99, n: 3 });
  seeded.push(r.choices.map((c) => [c.index, c.text]));
}
out.seeded = seeded;
console.log(JSON.stringify(out));
