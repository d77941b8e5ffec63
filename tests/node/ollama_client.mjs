// The pinned ollama npm client against gpuswapd's Ollama API (tests/integration/test_ollama.py):
// node ollama_client.mjs HOST MODEL [API_KEY]; prints one JSON line of what it saw.
import { Ollama } from "ollama";

const [host, model, key] = process.argv.slice(2);
const ollama = new Ollama({ host, headers: key ? { Authorization: `Bearer ${key}` } : undefined });
const opts = { temperature: 0, num_predict: 8 };
const out = {};
const names = async () => (await ollama.ps()).models.map((m) => m.name);
const fails = async (fn) => {
  try {
    await fn();
    return null;
  } catch (e) {
    return { status: e.status_code ?? null, error: e.error ?? e.message };
  }
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

out.version = (await ollama.version()).version;
out.list = (await ollama.list()).models.map((m) => ({ name: m.name, size: m.size, details: m.details }));
out.show = await ollama.show({ model });

const messages = [{ role: "user", content: "Once upon a time" }];
const chat = await ollama.chat({ model, messages, options: opts });
out.chat = { content: chat.message.content, role: chat.message.role, done: chat.done,
  done_reason: chat.done_reason, eval_count: chat.eval_count,
  prompt_eval_count: chat.prompt_eval_count, total_duration: chat.total_duration,
  eval_duration: chat.eval_duration, load_duration: chat.load_duration };
let text = "", parts = 0, last = null;
for await (const p of await ollama.chat({ model, messages, options: opts, stream: true })) {
  text += p.message.content;
  parts++;
  last = p;
}
out.chat_stream = { content: text, parts, done: last.done, done_reason: last.done_reason,
  eval_count: last.eval_count };

const gen = await ollama.generate({ model, prompt: "The cat", options: opts });
out.generate = { response: gen.response, done_reason: gen.done_reason, eval_count: gen.eval_count };
text = "";
parts = 0;
for await (const p of await ollama.generate({ model, prompt: "The cat", options: opts, stream: true })) {
  text += p.response;
  parts++;
  last = p;
}
out.generate_stream = { response: text, parts, done: last.done, eval_count: last.eval_count };
const raw = await ollama.generate({ model, prompt: "The cat", raw: true, options: opts });
out.generate_raw = raw.response;

const schema = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"],
  additionalProperties: false };
const fmt = await ollama.chat({ model, messages, format: schema,
  options: { temperature: 0, num_predict: 64 } });
out.format = { content: fmt.message.content, done_reason: fmt.done_reason };
const js = await ollama.generate({ model, prompt: "The cat", format: "json",
  options: { temperature: 0, num_predict: 64 } });
out.format_json = { response: js.response, done_reason: js.done_reason };

out.ps_after_chat = (await ollama.ps()).models;
await ollama.generate({ model, prompt: "The cat", options: opts, keep_alive: 0 });
out.ps_after_keep_alive_0 = await names();
await ollama.generate({ model, prompt: "The cat", options: opts, keep_alive: -1 });
out.ps_after_keep_alive_forever = (await ollama.ps()).models;
await ollama.generate({ model, prompt: "The cat", options: opts, keep_alive: "1s" });
out.ps_after_keep_alive_1s = (await ollama.ps()).models;
await sleep(2500);
out.ps_after_1s_passed = await names();
const load = await ollama.generate({ model });
out.load = { done: load.done, done_reason: load.done_reason, ps: await names() };
const unload = await ollama.chat({ model, messages: [], keep_alive: 0 });
out.unload = { done_reason: unload.done_reason, ps: await names() };

out.unknown_model = await fails(() => ollama.chat({ model: "no-such-model", messages }));
out.unknown_model_stream = await fails(async () => {
  for await (const p of await ollama.chat({ model: "no-such-model", messages, stream: true })) void p;
});
out.show_unknown = await fails(() => ollama.show({ model: "no-such-model" }));
out.images = await fails(() => ollama.generate({ model, prompt: "x", images: ["aGVsbG8="] }));
out.tools = await fails(() => ollama.chat({ model, messages,
  tools: [{ type: "function", function: { name: "f", description: "d", parameters: {} } }] }));
console.log(JSON.stringify(out));
