#!/usr/bin/python3
"""The Ollama API (issue 42) on the real daemon, sim and cpu backends, driven by the pinned ollama npm client (tests/node/ollama_client.mjs): tags, ps, show, chat and generate streamed and not, format, keep_alive (0 evicts, -1 pins, a duration expires), load/unload, errors; and raw HTTP for the NDJSON shape, API keys and refused fields."""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")
MODEL = os.path.abspath(os.path.join(DATA, "stories260K.gguf"))
FAILED = []


def check(name, cond, detail=""):
    print(("ok " if cond else "FAIL ") + name + ("" if cond else ": " + str(detail)[:3000]))
    if not cond:
        FAILED.append(name)


class OllamaDaemon(gsd.Daemon):
    """gsd.Daemon with an HTTP listener on a chosen backend."""

    def __init__(self, models, backend="sim", extra_listen="", **kw):
        self.port, self.backend = gsd.free_port(), backend
        super().__init__(models, listen="http: 127.0.0.1:%d\n%s" % (self.port, extra_listen), **kw)
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("no HTTP listener:\n" + self.logtext())
                time.sleep(0.02)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read().replace("  backend: sim\n", "  backend: %s\n" % self.backend, 1)
        with open(self.config, "w") as f:
            f.write(text)


def call(d, method, path, body=None, headers=None):
    """(status, content type, raw body text)."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=gsd.scaled(30))
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode()
    finally:
        c.close()


def test_node_client(d, backend):
    node = shutil.which("node")
    node_dir = os.path.join(gsd.ROOT, "tests", "node")
    if not node:
        print("skip: node not installed")
        return
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "ollama")):
        check("the ollama npm package is installed (make deps)", False, node_dir)
        return
    out = subprocess.run([node, os.path.join(node_dir, "ollama_client.mjs"),
                          "http://127.0.0.1:%d" % d.port, "m"],
                         capture_output=True, text=True, timeout=gsd.scaled(60), cwd=node_dir)
    check("%s: ollama node client runs" % backend, out.returncode == 0, out.stdout + out.stderr)
    if out.returncode:
        return
    r = json.loads(out.stdout.strip().splitlines()[-1])
    b = backend + ": "
    check(b + "version", r["version"] == "0.2.0", r["version"])
    check(b + "list names the models with gguf details",
          sorted(m["name"] for m in r["list"]) == ["m", "m2"] and
          all(m["details"]["format"] == "gguf" and m["size"] > 0 for m in r["list"]), r["list"])
    check(b + "show: architecture and context length",
          r["show"]["model_info"]["general.architecture"] == "llama" and
          r["show"]["model_info"]["llama.context_length"] > 0, r["show"])
    chat, cs = r["chat"], r["chat_stream"]
    check(b + "chat: an assistant message with Ollama's counts and durations",
          chat["role"] == "assistant" and chat["done"] and chat["done_reason"] == "length" and
          chat["eval_count"] == 8 and chat["prompt_eval_count"] > 0 and
          chat["total_duration"] >= chat["eval_duration"] > 0, chat)
    check(b + "chat streamed: the same text in several parts, done last",
          cs["content"] == chat["content"] and cs["parts"] > 2 and cs["done"] and
          cs["eval_count"] == 8 and cs["done_reason"] == "length", (cs, chat))
    check(b + "generate streamed and not: the same text",
          r["generate"]["response"] == r["generate_stream"]["response"] and
          r["generate"]["eval_count"] == 8 and r["generate_stream"]["done"], r)
    check(b + "generate raw skips the template: another text",
          isinstance(r["generate_raw"], str) and r["generate_raw"] != r["generate"]["response"], r)
    fmt = r["format"]
    ok = False
    try:
        ok = isinstance(json.loads(fmt["content"])["ok"], bool)
    except (ValueError, KeyError, TypeError):
        pass
    check(b + "format: a JSON schema constrains the output", ok and fmt["done_reason"] == "stop", fmt)
    fj = r["format_json"]
    try:
        ok = isinstance(json.loads(fj["response"]), dict)
    except ValueError:  # cut off by num_predict: still the start of an object
        ok = fj["done_reason"] == "length" and fj["response"].startswith("{")
    check(b + "format json: an object", ok, fj)
    ps = r["ps_after_chat"]
    if backend == "cpu":
        # the cpu backend reads weights in place from host RAM: every model is resident, with no
        # device copy, and evicting one frees nothing; keep_alive still pins and times out
        everyone = ["m", "m2"]
        check(b + "ps lists every model, none with device bytes",
              [m["name"] for m in ps] == everyone and all(m["size_vram"] == 0 for m in ps), ps)
        check(b + "keep_alive 0: still listed (nothing to evict)",
              r["ps_after_keep_alive_0"] == everyone, r["ps_after_keep_alive_0"])
        f, s = r["ps_after_keep_alive_forever"], r["ps_after_keep_alive_1s"]
        check(b + "keep_alive -1 and 1s: expires_at far away, then within seconds",
              f[0]["expires_at"] > "2300" and s[0]["name"] == "m" and s[0]["expires_at"] < "2300",
              (f, s))
        check(b + "load and unload answer", r["load"]["done_reason"] == "load" and
              r["unload"]["done_reason"] == "unload", (r["load"], r["unload"]))
    else:
        check(b + "ps lists the resident model with its device bytes",
              [m["name"] for m in ps] == ["m"] and ps[0]["size_vram"] > 0 and ps[0]["expires_at"], ps)
        check(b + "keep_alive 0 evicts the model: ps no longer lists it",
              r["ps_after_keep_alive_0"] == [], r["ps_after_keep_alive_0"])
        f = r["ps_after_keep_alive_forever"]
        check(b + "keep_alive -1 keeps it, expires_at far away",
              [m["name"] for m in f] == ["m"] and f[0]["expires_at"] > "2300", f)
        s = r["ps_after_keep_alive_1s"]
        check(b + "keep_alive 1s: expires_at within seconds",
              [m["name"] for m in s] == ["m"] and s[0]["expires_at"] < "2300", s)
        check(b + "keep_alive 1s: gone once it passed", r["ps_after_1s_passed"] == [],
              r["ps_after_1s_passed"])
        check(b + "a request without prompt loads the model",
              r["load"]["done_reason"] == "load" and r["load"]["ps"] == ["m"], r["load"])
        check(b + "one with keep_alive 0 and no messages unloads it",
              r["unload"]["done_reason"] == "unload" and r["unload"]["ps"] == [], r["unload"])
    for k in ("unknown_model", "show_unknown"):
        check(b + "%s: 404 with Ollama's error" % k,
              r[k] and r[k]["status"] == 404 and "no-such-model" in r[k]["error"], r[k])
    check(b + "an unknown model while streaming: the client throws",
          r["unknown_model_stream"] and "no-such-model" in r["unknown_model_stream"]["error"],
          r["unknown_model_stream"])
    for k in ("images", "tools"):
        check(b + "%s: 400 with the reason" % k,
              r[k] and r[k]["status"] == 400 and k in r[k]["error"], r[k])


def test_raw_http(d):
    st, ctype, text = call(d, "POST", "/api/generate", {"model": "m", "prompt": "The cat",
                                                        "options": {"num_predict": 4}})
    lines = [json.loads(l) for l in text.splitlines() if l]
    check("generate streams NDJSON by default",
          st == 200 and ctype == "application/x-ndjson" and len(lines) >= 2 and
          all(not l["done"] for l in lines[:-1]) and lines[-1]["done"] and
          lines[-1]["created_at"].endswith("Z"), (st, ctype, text))
    st, _, text = call(d, "POST", "/api/chat", {"model": "m", "messages": "x"})
    check("a bad field: 400 {\"error\": ...}", st == 400 and list(json.loads(text)) == ["error"],
          (st, text))
    st, _, text = call(d, "POST", "/api/chat", {"model": "m", "stream": False,
                                                "messages": [{"role": "user", "content": "a"}],
                                                "options": {"temperature": 500}})
    check("an option out of range: 400 naming it", st == 400 and "temperature" in text, (st, text))
    st, _, _ = call(d, "GET", "/api/chat")
    check("GET /api/chat: 405", st == 405, st)


def test_tools_on_a_qwen_template():
    """/api/chat's tools on a model whose template has Qwen's <tool_call> syntax: accepted (the
    model decides: auto, as Ollama has it), and a history with an assistant's call and its
    result renders and answers. (A family without a tool syntax refuses auto: the node test.)"""
    tmp = gsd.tmpdir(prefix="gsd-ollama-tools-")
    qwen = gsd.mkmodel(os.path.join(tmp, "qwen.gguf"),
                       "--arch qwen2 --type f32 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 "
                       "--vocab 600 --seed 7 --chat-template " +
                       os.path.join(DATA, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja"))
    d = OllamaDaemon([("q", qwen, ""), ("qr", qwen, "tool_choice: required")], memory="8MiB")
    tools = [{"type": "function", "function": {"name": "weather", "description": "w",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}}}}]
    try:
        st, _, text = call(d, "POST", "/api/chat", {
            "model": "q", "stream": False, "tools": tools, "options": {"num_predict": 8},
            "messages": [{"role": "user", "content": "weather in Paris?"}]})
        ans = json.loads(text)
        check("tools on a Qwen template: 200, done", st == 200 and ans.get("done"), (st, text))
        st, _, text = call(d, "POST", "/api/chat", {
            "model": "q", "stream": False, "tools": tools, "options": {"num_predict": 4},
            "messages": [{"role": "user", "content": "weather in Paris?"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "weather",
                                                       "arguments": {"city": "Paris"}}}]},
                         {"role": "tool", "content": "sunny"}]})
        check("a call and its result in the history: 200, done", st == 200 and
              json.loads(text).get("done"), (st, text))
        test_node_tool_call(d)
    finally:
        d.stop()


def test_node_tool_call(d):
    """The ollama client gets a tool call: a model whose config says tool_choice: required (Ollama's
    API has no tool_choice) answers with message.tool_calls, streamed and not, and the call with its
    result goes back for the next turn."""
    node, node_dir = shutil.which("node"), os.path.join(gsd.ROOT, "tests", "node")
    if not node:
        print("skip: node not installed")
        return
    out = subprocess.run([node, os.path.join(node_dir, "ollama_tools.mjs"), "http://127.0.0.1:%d" % d.port, "qr"],
                         capture_output=True, text=True, timeout=gsd.scaled(60), cwd=node_dir)
    check("ollama client tool call runs", out.returncode == 0, out.stdout + out.stderr)
    if out.returncode:
        return
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("plain", "stream"):  # required allows parallel calls: one or more, each enforced
        calls = r[k]["calls"] or []  # (random weights go on until max_tokens cuts one: content)
        check("%s: get_weather calls with their arguments as objects" % k,
              len(calls) >= 1 and all(c["function"]["name"] == "get_weather" and
                                      c["function"]["arguments"].get("city") in ("Paris", "Oslo") for c in calls)
              and (r[k]["content"] == "" or r[k]["content"].startswith("<tool_call>")), r[k])
    check("streamed and not: the same call", r["plain"]["calls"] == r["stream"]["calls"], r)
    check("the call and its result go back: done, a longer prompt",
          r["round_trip"]["done"] and r["round_trip"]["prompt_eval_count"] > r["round_trip"]["first_prompt_eval_count"], r)


def test_api_keys():
    k = json.loads(subprocess.run([os.path.abspath(os.path.join(gsd.BUILD, "gpuswap")), "keygen", "k",
                                   "--json"], capture_output=True, text=True, check=True).stdout)
    auth = "auth:\n  http: true\n  keys:\n    - name: k\n      hash: \"%s\"\n      models: [m]\n" % k["hash"]
    bearer = {"Authorization": "Bearer " + k["key"]}
    d = OllamaDaemon([("m", MODEL, "chat_template: chatml"), ("m2", MODEL, "")], extra=auth)
    try:
        st, _, text = call(d, "GET", "/api/tags")
        check("keys: no Authorization, 401 {\"error\"}", st == 401 and "error" in json.loads(text),
              (st, text))
        st, _, text = call(d, "GET", "/api/tags", headers=bearer)
        check("keys: tags lists only the key's models",
              st == 200 and [m["name"] for m in json.loads(text)["models"]] == ["m"], (st, text))
        st, _, text = call(d, "POST", "/api/generate", {"model": "m", "prompt": "a", "stream": False,
                                                        "options": {"num_predict": 2}},
                           headers=bearer)
        check("keys: generate with the key", st == 200 and json.loads(text)["done"], (st, text))
    finally:
        d.stop()


def main():
    t0 = time.time()
    for backend in ("sim", "cpu"):
        d = OllamaDaemon([("m", MODEL, "chat_template: chatml"), ("m2", MODEL, "")],
                         backend=backend, memory="8MiB")
        try:
            test_node_client(d, backend)
            if backend == "sim":
                test_raw_http(d)
        finally:
            rc = d.stop()
        check("%s: daemon exits cleanly" % backend, rc == 0, open(d.log_path).read()[-2000:])
    test_api_keys()
    test_tools_on_a_qwen_template()
    print("%.1f s" % (time.time() - t0))
    if FAILED:
        print("%d failed" % len(FAILED))
        sys.exit(1)


if __name__ == "__main__":
    main()
