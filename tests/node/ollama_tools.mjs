// The pinned ollama npm client calling a tool through gpuswapd's /api/chat (tests/integration/test_ollama.py):
// node ollama_tools.mjs HOST MODEL, MODEL configured with `tool_choice: required` (Ollama's API has no
// tool_choice: the model's default applies); prints one JSON line of what it saw.
import { Ollama } from "ollama";

const [host, model] = process.argv.slice(2);
const ollama = new Ollama({ host });
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo"] } },
                  required: ["city"] },
  },
}];
const messages = [{ role: "user", content: "Weather in Paris?" }];
const options = { temperature: 0, num_predict: 200 };
const out = {};

const plain = await ollama.chat({ model, messages, tools, options });
out.plain = { done_reason: plain.done_reason, content: plain.message.content, calls: plain.message.tool_calls ?? null };

let calls = [], content = "", parts = 0, last = null;
for await (const p of await ollama.chat({ model, messages, tools, options, stream: true })) {
  parts++;
  content += p.message.content;
  if (p.message.tool_calls) calls = calls.concat(p.message.tool_calls);
  last = p;
}
out.stream = { parts, content, calls, done: last.done, done_reason: last.done_reason };

// the call and its result go back: the next turn renders them and answers
const back = messages.concat([plain.message, { role: "tool", content: "{\"temp\": 21}" }]);
const next = await ollama.chat({ model, messages: back, tools, options: { temperature: 0, num_predict: 60 } });
out.round_trip = { done: next.done, prompt_eval_count: next.prompt_eval_count,
                   first_prompt_eval_count: plain.prompt_eval_count, calls: next.message.tool_calls ?? null };
console.log(JSON.stringify(out));
