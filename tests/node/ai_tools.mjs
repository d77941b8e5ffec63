// The Vercel AI SDK (ai + @ai-sdk/openai, chat completions) with tools (tests/integration/test_ai_sdk.py):
// argv BASE_URL MODEL. openai.chat(MODEL), generateText and streamText: a named toolChoice over two tools
// (one with a zod input schema, one with jsonSchema) and toolChoice 'required' with one tool (one or
// more calls not streamed, parallel calls allowed; exactly one streamed, parallelToolCalls false), each
// not streamed and streamed, the SDK parsing and validating the call's arguments against the schema;
// then the round trips: the assistant's call and a tool result sent back as messages (not streamed),
// and an execute function with stopWhen (streamed). Prints one line per check ("ok NAME {...}" or
// "FAIL NAME: why") and exits 1 when any failed.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, modelId] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey: "unused" });
const model = openai.chat(modelId);

const weatherInput = z.object({ city: z.enum(["Paris", "Oslo", "Zürich"]), unit: z.enum(["c", "f"]) });
const timeInput = { type: "object", properties: { zone: { type: "string", enum: ["UTC", "Europe/Paris"] } },
                    required: ["zone"], additionalProperties: false };
const getWeather = tool({ description: "The weather in a city, today.", inputSchema: weatherInput });
const getTime = tool({ description: "Local time in a zone.", inputSchema: jsonSchema(timeInput) });
const prompt = "Weather in Paris?";
// random weights write a lot of whitespace inside the JSON: room for the call, a short answer after it
const common = { model, temperature: 0, maxOutputTokens: 400, maxRetries: 0 };
const timeOk = (a) => a && Object.keys(a).length === 1 && timeInput.properties.zone.enum.includes(a.zone);
const weatherOk = (a) => weatherInput.strict().safeParse(a).success;

let failed = 0;
async function check(name, fn) {
  try {
    console.log("ok " + name + " " + JSON.stringify(await fn()));
  } catch (e) {
    failed++;
    console.log("FAIL " + name + ": " + (e && e.stack ? e.stack : e));
  }
}
function expect(cond, what, got) {
  if (!cond) throw new Error(what + ": " + JSON.stringify(got));
}
// one valid call named name whose parsed input passes ok, finish reason tool-calls, no text
// many: one or more calls (required with parallel calls, OpenAI's default), each checked
function oneCall(r, toolCalls, finishReason, text, name, ok, many = false) {
  expect(finishReason === "tool-calls", "finishReason", finishReason);
  expect(many ? toolCalls.length >= 1 : toolCalls.length === 1, many ? "one or more calls" : "one call", toolCalls);
  for (const c of toolCalls) {
    expect(c.toolName === name && !c.invalid && !c.dynamic, "a valid call of " + name, c);
    expect(ok(c.input), "input matching the schema", c.input);
    expect(typeof c.toolCallId === "string" && c.toolCallId.length > 0, "toolCallId", c);
  }
  expect(new Set(toolCalls.map((c) => c.toolCallId)).size === toolCalls.length, "distinct ids", toolCalls);
  expect(text === "", "no text", text);
  return toolCalls[0];
}
// a stream's parts by type (error parts fail the check)
async function drain(s) {
  const parts = {};
  for await (const p of s.fullStream) {
    if (p.type === "error") throw p.error;
    parts[p.type] = (parts[p.type] || 0) + 1;
  }
  return parts;
}

let weatherCall, weatherResult;
await check("generate_named", async () => {
  const r = await generateText({ ...common, prompt, tools: { get_weather: getWeather, get_time: getTime },
                                 toolChoice: { type: "tool", toolName: "get_weather" } });
  weatherCall = oneCall(r, r.toolCalls, r.finishReason, r.text, "get_weather", weatherOk);
  weatherResult = r;
  expect(r.usage.inputTokens > 0 && r.usage.outputTokens > 0, "usage", r.usage);
  return { input: weatherCall.input, id: weatherCall.toolCallId, usage: r.usage.inputTokens };
});

await check("stream_named", async () => {
  const s = streamText({ ...common, prompt, tools: { get_weather: getWeather, get_time: getTime },
                         toolChoice: { type: "tool", toolName: "get_weather" } });
  const parts = await drain(s);
  const c = oneCall(s, await s.toolCalls, await s.finishReason, await s.text, "get_weather", weatherOk);
  expect(parts["tool-input-start"] === 1 && parts["tool-input-delta"] >= 1 && parts["tool-call"] === 1,
         "tool-input parts", parts);
  const usage = await s.usage;
  expect(usage.inputTokens > 0 && usage.outputTokens > 0, "usage", usage);
  if (weatherCall) expect(JSON.stringify(c.input) === JSON.stringify(weatherCall.input), "the same input as generateText", c.input);
  return { input: c.input, deltas: parts["tool-input-delta"] };
});

// required with parallel calls (the default): random weights rarely end after a call, so the
// calls go on until maxOutputTokens cuts one, which comes back as text (docs/TOOLS.md)
await check("generate_required", async () => {
  const r = await generateText({ ...common, prompt, tools: { get_time: getTime }, toolChoice: "required" });
  const c = oneCall(r, r.toolCalls, r.finishReason, "", "get_time", timeOk, true);
  expect(r.text === "" || r.text.startsWith("<tool_call>"), "no text but a cut-off call", r.text);
  return { input: c.input, calls: r.toolCalls.length };
});

// with parallelToolCalls false: exactly one call, enforced
await check("stream_required", async () => {
  const s = streamText({ ...common, prompt, tools: { get_time: getTime }, toolChoice: "required",
                         providerOptions: { openai: { parallelToolCalls: false } } });
  const parts = await drain(s);
  const c = oneCall(s, await s.toolCalls, await s.finishReason, await s.text, "get_time", timeOk);
  return { input: c.input, deltas: parts["tool-input-delta"] };
});

// the call and its result as the SDK's messages; auto now: free text from random weights
await check("generate_round_trip", async () => {
  expect(weatherResult, "generate_named's call", null);
  const messages = [{ role: "user", content: prompt }, ...weatherResult.response.messages,
    { role: "tool", content: [{ type: "tool-result", toolCallId: weatherCall.toolCallId, toolName: "get_weather",
                                output: { type: "json", value: { temp: 21 } } }] }];
  const r = await generateText({ ...common, maxOutputTokens: 4, messages,
                                 tools: { get_weather: getWeather, get_time: getTime }, toolChoice: "auto" });
  expect(["length", "stop"].includes(r.finishReason), "finishReason", r.finishReason);
  const sent = r.request.body.messages;
  expect(sent.some((m) => m.role === "tool" && m.tool_call_id === weatherCall.toolCallId), "the tool message sent", sent);
  expect(r.usage.inputTokens > weatherResult.usage.inputTokens, "a longer prompt", r.usage);
  return { finish: r.finishReason, usage: r.usage.inputTokens };
});

// execute and stopWhen: the SDK runs the tool and sends its result back itself (step 2 auto)
await check("stream_round_trip", async () => {
  const seen = [];
  const s = streamText({
    ...common, prompt, toolChoice: { type: "tool", toolName: "get_weather" }, stopWhen: stepCountIs(2),
    tools: { get_weather: tool({ ...getWeather, execute: async (input) => { seen.push(input); return { temp: 21 }; } }),
             get_time: getTime },
    prepareStep: ({ stepNumber }) => (stepNumber === 0 ? {} : { toolChoice: "auto", maxOutputTokens: 4 }),
  });
  await drain(s);
  const steps = await s.steps;
  expect(steps.length === 2, "two steps", steps.map((st) => st.finishReason));
  oneCall(steps[0], steps[0].toolCalls, steps[0].finishReason, steps[0].text, "get_weather", weatherOk);
  expect(seen.length === 1 && weatherOk(seen[0]), "execute ran once with valid input", seen);
  expect(steps[0].toolResults.length === 1 && steps[0].toolResults[0].output.temp === 21, "the tool result", steps[0].toolResults);
  expect(["length", "stop"].includes(steps[1].finishReason), "second step's finishReason", steps[1].finishReason);
  const sent = steps[1].request.body.messages;
  expect(sent.some((m) => m.role === "tool" && m.tool_call_id === steps[0].toolCalls[0].toolCallId),
         "the tool message sent", sent);
  expect(steps[1].usage.inputTokens > steps[0].usage.inputTokens, "a longer prompt", steps[1].usage);
  return { input: seen[0], finish: steps[1].finishReason, usage: steps[1].usage.inputTokens };
});

process.exit(failed ? 1 : 0);
