// The official OpenAI Node SDK against `gpuswapd serve` (tests/integration/test_serve.py): argv BASE_URL.
// Prints one JSON line: the models it lists and a completion of the first.
import OpenAI from "openai";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const models = [];
for await (const m of client.models.list()) models.push({ id: m.id, available: m.available });
const done = await client.completions.create({ model: models[0].id, prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
console.log(JSON.stringify({ models, text: done.choices[0].text, finish_reason: done.choices[0].finish_reason }));
