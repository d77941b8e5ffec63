"""Tool calls whose markers are control tokens (issue 41, docs/TOOLS.md "Markers that are control
tokens"), and required with parallel calls in the <tool_call> styles: generated models whose
vocabularies hold the family's markers as control tokens (mkmodel --control), as real ones do
(Qwen's <tool_call>/</tool_call> where marked so, Llama 3.1's <|python_tag|>), and the output forced
with logit_bias inside the constraint; over HTTP, streamed and not."""
import http.client
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-markers-")
DATA = os.environ.get("GPUSWAPD_DATA", os.path.join(gsd.ROOT, "tests", "data"))
QWEN = os.path.join(DATA, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
LLAMA31 = os.path.join(DATA, "templates", "meta-llama-Llama-3.1-8B-Instruct.jinja")
PORT = gsd.free_port()
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
                                          "required": ["unit"], "additionalProperties": False}}}]
CODE = [{"type": "function", "function": {
    "name": "code_interpreter", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]
MSGS = [{"role": "user", "content": "Weather in Oslo?"}]


def token_id(model, text):
    out = subprocess.run([gsd.GPUSWAPD, "tokenize", "-m", model, "--special"], input=text.encode(),
                         capture_output=True, check=True)
    ids = out.stdout.split()  # BOS first where the vocabulary adds it
    assert 1 <= len(ids) <= 2, (text, ids)
    return int(ids[-1])


def post(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=gsd.scaled(60))
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    assert r.status == 200, (r.status, data)
    if not body.get("stream"):
        return json.loads(data)
    chunks = [json.loads(l[6:]) for l in data.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
    return chunks


def both(body):
    """The answer and the stream of one request: (message, finish, calls put together from the
    stream, streamed content, stream's finish)."""
    ans = post(dict(body, stream=False))
    ch = ans["choices"][0]
    calls, content, finish = {}, "", None
    for chunk in post(dict(body, stream=True)):
        for c in chunk["choices"]:
            d = c.get("delta", {})
            content += d.get("content") or ""
            for t in d.get("tool_calls", []):
                if "id" in t:
                    calls[t["index"]] = {"id": t["id"], "type": "function",
                                         "function": {"name": t["function"]["name"], "arguments": ""}}
                calls[t["index"]]["function"]["arguments"] += t["function"].get("arguments", "")
            finish = c.get("finish_reason") or finish
    return ch["message"], ch["finish_reason"], [calls[k] for k in sorted(calls)], content, finish


def required_ends_a_call_with_the_control_token_and_it_never_leaks():
    """required over one tool, the closing </tool_call> (a control token) and the end of generation
    biased up: the constraint offers the control token after the call, the parser sees its text,
    and one call comes back, nothing as content, streamed as not."""
    bias = {str(QWEN_IDS["</tool_call>"]): 100, str(QWEN_IDS["<|im_end|>"]): 100,
            str(QWEN_IDS["<|endoftext|>"]): 100}
    req = {"model": "qwen", "messages": MSGS, "tools": WEATHER, "tool_choice": "required",
           "max_tokens": 200, "temperature": 0, "logit_bias": bias}
    msg, finish, streamed, content, sfinish = both(req)
    assert finish == "tool_calls" and sfinish == "tool_calls", (msg, finish, sfinish)
    calls = msg["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", calls
    assert json.loads(calls[0]["function"]["arguments"])["unit"] in ("c", "f"), calls
    assert msg["content"] is None and content == "", (msg, content)
    assert [c["function"] for c in streamed] == [c["function"] for c in calls], (streamed, calls)


def required_with_parallel_calls_writes_several_blocks():
    """Both markers biased up and the end of generation down: block after block until max_tokens,
    every complete block a call (two at least), the markers never in the content."""
    bias = {str(QWEN_IDS["</tool_call>"]): 100, str(QWEN_IDS["<tool_call>"]): 100,
            str(QWEN_IDS["<|im_end|>"]): -100, str(QWEN_IDS["<|endoftext|>"]): -100}
    req = {"model": "qwen", "messages": MSGS, "tools": WEATHER, "tool_choice": "required",
           "max_tokens": 400, "temperature": 0, "logit_bias": bias}
    msg, finish, streamed, content, sfinish = both(req)
    calls = msg.get("tool_calls") or []
    assert len(calls) >= 2 and finish == "tool_calls" and sfinish == "tool_calls", (msg, finish)
    assert all(c["function"]["name"] == "get_weather" for c in calls), calls
    assert all(json.loads(c["function"]["arguments"])["unit"] in ("c", "f") for c in calls), calls
    assert len({c["id"] for c in calls}) == len(calls), calls
    assert "</tool_call>" not in (msg["content"] or "") and "</tool_call>" not in content, (msg, content)
    assert [c["function"] for c in streamed][:len(calls)] == [c["function"] for c in calls], (streamed, calls)
    # parallel_tool_calls false: exactly one call, enforced
    msg, finish, streamed, content, _ = both(dict(req, parallel_tool_calls=False, max_tokens=200))
    assert finish == "tool_calls" and len(msg["tool_calls"]) == 1 and len(streamed) == 1, msg


def without_tools_control_tokens_stay_hidden():
    ans = post({"model": "qwen", "messages": MSGS, "max_tokens": 3, "temperature": 0,
                "logit_bias": {str(QWEN_IDS["<tool_call>"]): 100}})
    assert ans["choices"][0]["message"]["content"] == "", ans
    assert ans["usage"]["completion_tokens"] == 3, ans


def llama_python_tag_control_token_is_a_code_interpreter_call():
    """auto on Llama 3.1's template: <|python_tag|> (a control token) written first makes the answer
    a code_interpreter call (its code what follows: nothing here); without the fix it was lost."""
    req = {"model": "llama", "messages": MSGS, "tools": CODE, "max_tokens": 1, "temperature": 0,
           "logit_bias": {str(LLAMA_TAG): 100}}
    msg, finish, streamed, content, sfinish = both(req)
    assert finish == "tool_calls" and sfinish == "tool_calls", (msg, finish, sfinish)
    calls = msg["tool_calls"]
    assert [c["function"] for c in calls] == [{"name": "code_interpreter", "arguments": "{\"code\":\"\"}"}], calls
    assert msg["content"] is None and content == "", (msg, content)
    assert [c["function"] for c in streamed] == [c["function"] for c in calls], streamed
    # tool_choice none: the tag is a control token again, no text
    ans = post(dict(req, tool_choice="none"))
    assert ans["choices"][0]["message"]["content"] == "" and "tool_calls" not in ans["choices"][0]["message"], ans


def main():
    global QWEN_IDS, LLAMA_TAG
    r = gsd.Runner()
    qwen = gsd.mkmodel(os.path.join(TMP, "qwen.gguf"), "--arch qwen2 --type f32 --dim 64 --layers 2 --heads 4 "
                       "--kv-heads 2 --ff 128 --vocab 600 --seed 7 --control <tool_call> --control </tool_call> "
                       "--chat-template " + QWEN)
    llama = gsd.mkmodel(os.path.join(TMP, "llama.gguf"), "--type f32 --dim 64 --layers 2 --heads 4 "
                        "--kv-heads 2 --ff 128 --vocab 600 --seed 9 --control <|python_tag|> --chat-template "
                        + LLAMA31)
    QWEN_IDS = {t: token_id(qwen, t) for t in ("<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>")}
    assert QWEN_IDS["<tool_call>"] == 598 and QWEN_IDS["</tool_call>"] == 599, QWEN_IDS
    LLAMA_TAG = token_id(llama, "<|python_tag|>")
    d = gsd.Daemon([("qwen", qwen, ""), ("llama", llama, "")], memory="16MiB",
                   listen="http: 127.0.0.1:%d" % PORT)
    try:
        for fn in (required_ends_a_call_with_the_control_token_and_it_never_leaks,
                   required_with_parallel_calls_writes_several_blocks,
                   without_tools_control_tokens_stay_hidden,
                   llama_python_tag_control_token_is_a_code_interpreter_call):
            r.run(fn)
    finally:
        assert d.stop() == 0
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
