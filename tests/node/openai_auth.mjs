// The official OpenAI Node SDK against gpuswapd with API keys (tests/integration/test_auth.py):
// argv: BASE_URL KEY. Prints one JSON line: what worked with the key, and the errors without it.
import OpenAI from "openai";
import { readFileSync } from "node:fs";

const [baseURL, apiKey] = process.argv.slice(2);
const version = JSON.parse(readFileSync(new URL("./node_modules/openai/package.json", import.meta.url))).version;

async function refused(key) {
  const client = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
  try {
    await client.models.list();
    return { error: "none" };
  } catch (e) {
    return { error: e instanceof OpenAI.AuthenticationError ? "AuthenticationError" : String(e), status: e.status };
  }
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const models = [];
for await (const m of client.models.list()) models.push(m.id);
const done = await client.completions.create({ model: models[0], prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
const out = {
  version,
  with_key: { models, text: done.choices[0].text, finish_reason: done.choices[0].finish_reason },
  without_key: await refused(""),
  wrong_key: await refused("gsk_not-a-key"),
};
console.log(JSON.stringify(out));
