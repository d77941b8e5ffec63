// The official OpenAI Node SDK with tools (tests/integration/test_tool_templates.py): argv BASE_URL MODEL.
// tool_choice naming a function, not streamed and streamed (delta.tool_calls put together by the
// SDK's stream helper, its tool_calls.function.arguments.delta events counted), then a tool-result round trip: the assistant's tool_calls and a tool message
// sent back. Prints one JSON line with what each step got.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city, today.",
    parameters: {
      type: "object",
      properties: { city: { type: "string", enum: ["Paris", "Oslo", "Zürich"] }, unit: { type: "string", enum: ["c", "f"] } },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
}];
const messages = [{ role: "user", content: "Weather in Paris?" }];
const tool_choice = { type: "function", function: { name: "get_weather" } };
const body = { model, messages, tools, tool_choice, temperature: 0, max_tokens: 400 };
const out = {};

const r = await client.chat.completions.create(body);
const call = r.choices[0].message.tool_calls[0];
out.plain = { finish: r.choices[0].finish_reason, name: call.function.name, args: JSON.parse(call.function.arguments), id: call.id, prompt_tokens: r.usage.prompt_tokens };

// streamed: the SDK's helper joins the delta.tool_calls fragments into the final message; its
// argument events show the arguments growing as the model writes them (a fragment a token)
let fragments = 0;
const deltas = [];
let argsDone = null; // parsed_arguments stays null: the SDK parses only strict tools
const stream = client.beta.chat.completions.stream({ ...body, stream: true });
stream.on("tool_calls.function.arguments.delta", (e) => deltas.push({ name: e.name, index: e.index, delta: e.arguments_delta, sofar: e.arguments }));
stream.on("tool_calls.function.arguments.done", (e) => { argsDone = { name: e.name, index: e.index, args: e.arguments }; });
for await (const chunk of stream) fragments += chunk.choices[0]?.delta?.tool_calls ? 1 : 0;
const fin = await stream.finalChatCompletion();
const sc = fin.choices[0].message.tool_calls[0];
out.streamed = {
  finish: fin.choices[0].finish_reason, name: sc.function.name, id: sc.id, args: JSON.parse(sc.function.arguments),
  text: sc.function.arguments, fragments, arg_deltas: deltas.length, max_delta: Math.max(0, ...deltas.map((d) => d.delta.length)),
  joined: deltas.map((d) => d.delta).join(""), delta_names: [...new Set(deltas.map((d) => d.name))], done: argsDone,
};

// the round trip: the call and its result go back, the model goes on (auto: free text, parsed)
const back = [...messages, r.choices[0].message, { role: "tool", tool_call_id: call.id, content: "{\"temp\": 21}" }];
const r2 = await client.chat.completions.create({ model, messages: back, tools, tool_choice: "auto", temperature: 0, max_tokens: 4 });
out.round_trip = { finish: r2.choices[0].finish_reason, prompt_tokens: r2.usage.prompt_tokens, content: r2.choices[0].message.content };
console.log(JSON.stringify(out));
