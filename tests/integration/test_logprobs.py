#!/usr/bin/python3
"""logprobs, top_logprobs, logit_bias, n > 1 and echo (issue 40) on the real daemon (sim backend, the real stories260K model): the socket protocol and the OpenAI HTTP shapes, top_logprobs against llama.cpp's recorded logits (tests/data/reference)."""
import http.client
import json
import math
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
REF = os.path.join(DATA, "reference")
PROMPTS = {"once-upon-a-time": "Once upon a time", "lily-went-to-the-park": "Lily went to the park",
           "the-cat": "The cat"}
TOL = 1e-3

FAILED = []


def check(name, cond, detail=""):
    print(("ok " if cond else "FAIL ") + name + ("" if cond else ": " + str(detail)))
    if not cond:
        FAILED.append(name)


class HttpDaemon(gsd.Daemon):
    def __init__(self, models, **kw):
        self.port = gsd.free_port()
        super().__init__(models, listen="http: 127.0.0.1:%d\n" % self.port, **kw)
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("no HTTP listener:\n" + self.logtext())
                time.sleep(0.02)


def post(d, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=gsd.scaled(timeout))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        if body.get("stream") and r.status == 200:
            chunks = [json.loads(l[6:]) for l in raw.decode().splitlines()
                      if l.startswith("data: ") and l != "data: [DONE]"]
            return r.status, chunks
        return r.status, json.loads(raw)
    finally:
        c.close()


def ref_log_softmax(name, kv):
    want = {}
    for line in open(os.path.join(REF, "logits_step0_%s_kv%s.txt" % (name, kv))):
        i, v = line.split()
        want[int(i)] = float(v)
    m = max(want.values())
    lse = m + math.log(sum(math.exp(v - m) for v in want.values()))
    return {i: v - lse for i, v in want.items()}


def test_top_logprobs_match_llama_cpp(d):
    """Step 0's top 20 (chat's shape via the socket entries) equal the log-softmax of llama.cpp's logits."""
    for name, prompt in PROMPTS.items():
        want = ref_log_softmax(name, "f16")  # the daemon's default KV cache is F16
        c = d.client()
        done = c.call({"op": "generate", "id": "r", "model": "m", "prompt": prompt, "max_tokens": 1,
                       "temperature": 0, "logprobs": True, "top_logprobs": 20})
        c.close()
        e = done["logprobs"][0]
        best = sorted(want, key=lambda i: -want[i])[:20]
        got = [(t["token"], t["logprob"]) for t in e["top_logprobs"]]
        err = max(abs(lp - want[i]) for i, lp in got)
        check("socket top_logprobs %s within %g of llama.cpp (max err %.2g)" % (name, TOL, err),
              err <= TOL and len(got) == 20, got[:3])
        # the same 20 ids, up to near-ties at the cut
        check("socket top_logprobs %s are llama.cpp's 20 best" % name,
              all(i in best or abs(want[i] - want[best[-1]]) < TOL for i, _ in got), (got, best))
        check("socket logprob of the sampled token %s is the best's" % name,
              e["token"] == got[0][0] and abs(e["logprob"] - got[0][1]) < 1e-6, e)
        check("socket entry %s has its bytes" % name,
              bytes(e["bytes"]).decode("utf-8", "replace") == e["text"], e)
        # HTTP chat: the OpenAI shape, the same numbers
        st, body = post(d, "/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
            "temperature": 0, "logprobs": True, "top_logprobs": 5})
        content = body["choices"][0]["logprobs"]["content"] if st == 200 else None
        check("chat logprobs shape %s" % name, st == 200 and len(content) >= 1 and
              set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"} and
              len(content[0]["top_logprobs"]) == 5 and
              set(content[0]["top_logprobs"][0]) == {"token", "logprob", "bytes"}, body)
        # completions: the legacy shape, step 0 against the reference
        st, body = post(d, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 3,
                                               "temperature": 0, "logprobs": 5})
        lp = body["choices"][0]["logprobs"] if st == 200 else {}
        ok = st == 200 and set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        ok = ok and len(lp["tokens"]) == 3 and len(lp["top_logprobs"][0]) <= 5
        ok = ok and abs(lp["token_logprobs"][0] - max(want.values())) <= TOL
        ok = ok and "".join(lp["tokens"]) == body["choices"][0]["text"]
        ok = ok and lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
        check("completions legacy logprobs shape and values %s" % name, ok, body)


def test_stream_logprobs(d):
    st, chunks = post(d, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "The cat"}], "max_tokens": 4,
        "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True})
    content = [c for ch in chunks for ch2 in ch["choices"] if ch2.get("logprobs")
               for c in ch2["logprobs"]["content"]]
    check("streamed chat carries one logprobs entry per token", st == 200 and len(content) == 4 and
          all(len(c["top_logprobs"]) == 2 for c in content), chunks)


def test_n_choices(d):
    for path, extra in (("/v1/completions", {"prompt": "Once upon a time"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        body = dict(extra, model="m", max_tokens=12, n=3, temperature=0)
        st, r = post(d, path, body)
        texts = [(c.get("text") or c.get("message", {}).get("content")) for c in r.get("choices", [])]
        check("n 3 at temperature 0 on %s: three equal choices" % path,
              st == 200 and len(texts) == 3 and len(set(texts)) == 1 and
              [c["index"] for c in r["choices"]] == [0, 1, 2], r)
        body.update(temperature=1, seed=1234)
        st, r1 = post(d, path, body)
        st2, r2 = post(d, path, body)
        t1 = [c.get("text") or c["message"]["content"] for c in r1.get("choices", [])]
        t2 = [c.get("text") or c["message"]["content"] for c in r2.get("choices", [])]
        check("n 3 at temperature 1 with a seed on %s: reproducible" % path,
              st == st2 == 200 and t1 == t2 and len(t1) == 3, (r1, r2))
        check("n 3 at temperature 1 on %s: the choices differ" % path, len(set(t1)) > 1, t1)
        check("n 3 usage counts every choice on %s" % path,
              r1["usage"]["completion_tokens"] >= 3 and
              r1["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"], r1["usage"])
        # n = 1 with the seed draws what choice 0 of n = 3 drew
        st, one = post(d, path, dict(body, n=1))
        c0 = one["choices"][0]
        check("choice 0 of n 3 equals n 1 with the same seed on %s" % path,
              (c0.get("text") or c0["message"]["content"]) == t1[0], (one, t1))
    # streamed: chunks of every index, each with its finish_reason, then one usage chunk
    st, chunks = post(d, "/v1/completions", {"model": "m", "prompt": "The cat", "max_tokens": 5,
                                             "n": 2, "temperature": 1, "seed": 5, "stream": True,
                                             "stream_options": {"include_usage": True}})
    fins = sorted(c["choices"][0]["index"] for c in chunks
                  if c["choices"] and c["choices"][0]["finish_reason"])
    check("streamed n 2: a finish for each index and a usage chunk",
          st == 200 and fins == [0, 1] and chunks[-1]["usage"]["completion_tokens"] >= 2, chunks)
    # the socket: a done line per choice, "left" counting down
    c = d.client()
    c.send({"op": "generate", "id": 7, "model": "m", "prompt": "The cat", "max_tokens": 4, "n": 3,
            "temperature": 0})
    dones = [c.recv() for _ in range(3)]
    c.close()
    check("socket n 3: three done lines with index and left",
          sorted(x["index"] for x in dones) == [0, 1, 2] and [x["left"] for x in dones] == [2, 1, 0]
          and dones[-1]["usage"]["completion_tokens"] == 12, dones)


def test_n_runs_in_one_batch(d):
    """n = 3 siblings step together: about the forward passes of n = 1, and one request counted."""
    def run(n):
        before = d.stats()["models"]["m"]
        c = d.client()
        c.send({"op": "generate", "id": 1, "model": "m", "prompt": "Once upon a time",
                "max_tokens": 40, "temperature": 0, "n": n})
        for _ in range(n):
            done = c.recv()
        c.close()
        after = d.stats()["models"]["m"]
        return ({k: after[k] - before[k] for k in ("total_steps", "total_requests", "total_completed")},
                done["usage"]["completion_tokens"])
    one, t1 = run(1)
    three, t3 = run(3)
    print("  forward passes: n 1 %d, n 3 %d (%d and %d tokens)" %
          (one["total_steps"], three["total_steps"], t1, t3))
    check("n 3 takes about the passes of n 1 (one batch)", t3 == 3 * t1 and
          three["total_steps"] <= one["total_steps"] + 2, (one, three))
    check("n 3 counts one request, completed once",
          three["total_requests"] == 1 and three["total_completed"] == 1, three)
    # the siblings share the prompt's KV: one prefills it, the others wait and copy it (the
    # prefix cache's wait for a prefix admitted with them), so it is prefilled about once
    prompt = " ".join("word%d" % i for i in range(60))
    keys = ("total_prompt_tokens", "total_prefix_waits", "total_prefix_hits", "total_prefix_copies")
    got = {}
    for n in (1, 3):
        before = d.stats()["models"]["m"]
        c = d.client()
        c.send({"op": "generate", "id": 2, "model": "m", "prompt": "n%d %s" % (n, prompt),
                "max_tokens": 4, "temperature": 0, "n": n})
        for _ in range(n):
            done = c.recv()
        c.close()
        after = d.stats()["models"]["m"]
        got[n] = dict({k: after[k] - before[k] for k in keys}, prompt=done["usage"]["prompt_tokens"])
    print("  prompt of %d tokens: n 1 %s; n 3 %s" % (got[1]["prompt"], got[1], got[3]))
    check("n 3 prefills its prompt about once: the other two choices copy its KV",
          got[3]["total_prompt_tokens"] <= got[1]["total_prompt_tokens"] + 4 and
          got[3]["total_prefix_hits"] == 2, got)


def test_n_stream_cancel_and_errors(d):
    """Socket: a streamed n = 3 carries index on its tokens; a cancel ends every choice, left
    counting down to 0; a request whose choices cannot all run is answered by one error."""
    c = d.client()
    c.send({"op": "generate", "id": "s", "model": "m", "prompt": "Once", "max_tokens": 200, "n": 3,
            "temperature": 1, "seed": 3, "stream": True, "logprobs": True, "top_logprobs": 1})
    seen = set()
    while len(seen) < 3:
        ev = c.recv()
        check("a streamed token of n 3 has its index and logprobs", ev.get("event") == "token" and
              ev.get("index") in (0, 1, 2) and "logprobs" in ev, ev)
        if ev.get("event") != "token":
            break
        seen.add(ev["index"])
    c.send({"op": "cancel", "id": "k", "target": "s"})
    dones, ok = [], None
    while len(dones) < 3 or ok is None:
        ev = c.recv()
        if ev.get("id") == "k":
            ok = ev
        elif ev.get("event") == "done":
            dones.append(ev)
    check("cancel ends the three choices", ok.get("found") is True and
          sorted(x["index"] for x in dones) == [0, 1, 2] and [x["left"] for x in dones] == [2, 1, 0]
          and all(x["finish_reason"] == "cancelled" for x in dones), (ok, dones))
    ev = c.call({"op": "generate", "id": "big", "model": "m", "prompt": "Once", "max_tokens": 100000,
                 "n": 3})
    check("n 3 over the context: one context_overflow", ev.get("event") == "error" and
          ev["error"]["code"] == "context_overflow", ev)
    ev = c.call({"op": "generate", "id": "after", "model": "m", "prompt": "Once", "max_tokens": 2})
    check("the connection goes on after it", ev.get("event") == "done", ev)
    # a client that goes away mid n = 3 frees every choice
    c2 = d.client()
    c2.send({"op": "generate", "id": "gone", "model": "m", "prompt": "Once", "max_tokens": 200,
             "n": 3, "stream": True})
    c2.recv()
    c2.close()
    c.close()
    deadline, m = time.time() + gsd.scaled(10), {}
    while time.time() < deadline:
        m = d.stats()["models"]["m"]
        if m["curr_active"] == 0 and m["curr_queued"] == 0:
            break
        time.sleep(0.1)
    check("a client gone mid n 3 leaves no choice running",
          m.get("curr_active") == 0 and m.get("curr_queued") == 0, m)


def test_logit_bias_and_echo(d):
    st, r = post(d, "/v1/completions", {"model": "m", "prompt": "The cat", "max_tokens": 1,
                                        "temperature": 0, "logprobs": 1})
    first = r["choices"][0]["logprobs"]["tokens"][0]
    c = d.client()
    base = c.call({"op": "generate", "id": 1, "model": "m", "prompt": "The cat", "max_tokens": 1,
                   "temperature": 0, "logprobs": True})
    tid = base["logprobs"][0]["token"]
    biased = c.call({"op": "generate", "id": 2, "model": "m", "prompt": "The cat", "max_tokens": 1,
                     "temperature": 0, "logprobs": True, "logit_bias": {str(tid): -100}})
    forced = c.call({"op": "generate", "id": 3, "model": "m", "prompt": "The cat", "max_tokens": 3,
                     "temperature": 0, "logprobs": True, "logit_bias": {"400": 100}})
    c.close()
    check("logit_bias -100 bans the greedy token, logprobs stay the model's",
          biased["logprobs"][0]["token"] != tid and biased["logprobs"][0]["logprob"] < base["logprobs"][0]["logprob"], biased)
    check("logit_bias 100 forces a token", [e["token"] for e in forced["logprobs"]] == [400] * 3, forced)
    check("completions first token text matches the socket's", first == base["logprobs"][0]["text"], (first, base))
    st, r = post(d, "/v1/completions", {"model": "m", "prompt": "The cat", "max_tokens": 4,
                                        "temperature": 0, "echo": True})
    check("echo puts the prompt ahead of the text", st == 200 and
          r["choices"][0]["text"].startswith("The cat") and len(r["choices"][0]["text"]) > 7, r)
    for body, what in (({"logit_bias": {"x": 1}}, "not a token id"),
                       ({"logit_bias": {"1": 101}}, "-100 .. 100"),
                       ({"logit_bias": {"99999": 1}}, "vocabulary"),
                       ({"n": 17}, "'n'"),
                       ({"logprobs": 21}, "top_logprobs"),
                       ({"echo": True, "logprobs": 1}, "'echo' and 'logprobs'"),
                       ({"suffix": "end"}, "fill-in-the-middle")):
        st, r = post(d, "/v1/completions", dict(body, model="m", prompt="The cat", max_tokens=2))
        msg = r.get("error", {}).get("message", "")
        check("refused with 400: %s" % json.dumps(body), st == 400 and what in msg, (st, r))
    st, r = post(d, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                             "top_logprobs": 3})
    check("chat top_logprobs without logprobs is refused", st == 400, r)


def test_openai_node_sdk(d):
    """The pinned openai npm client (tests/node, package-lock.json) reads top_logprobs and n = 3."""
    node = shutil.which("node")
    if not node:
        print("skip: node not installed")
        return
    node_dir = os.path.join(gsd.ROOT, "tests", "node")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        check("the openai npm package is installed (make deps)", False, node_dir)
        return
    out = subprocess.run([node, os.path.join(node_dir, "openai_logprobs.mjs"),
                          "http://127.0.0.1:%d/v1" % d.port, "m"],
                         capture_output=True, text=True, timeout=gsd.scaled(120), cwd=node_dir)
    check("openai node sdk runs", out.returncode == 0, out.stdout + out.stderr)
    if out.returncode:
        return
    r = json.loads(out.stdout.strip().splitlines()[-1])
    want = ref_log_softmax("the-cat", "f16")
    chat = r["chat"]
    check("node sdk %s: chat top_logprobs, 5 per token" % r["version"],
          len(chat) == 3 and all(len(c["top"]) == 5 for c in chat) and
          chat[0]["top"][0][0] == chat[0]["token"], chat)
    check("node sdk: streamed logprobs equal the whole answer's",
          [(c["token"], round(c["logprob"], 6)) for c in r["streamed"]] ==
          [(c["token"], round(c["logprob"], 6)) for c in chat], r["streamed"])
    comp = r["completion"]
    check("node sdk: completions logprobs, step 0 as llama.cpp's",
          len(comp["tokens"]) == 3 and abs(comp["token_logprobs"][0] - max(want.values())) <= TOL and
          comp["text_offset"][0] == 0, comp)
    check("node sdk: n 3 at temperature 0, three equal choices",
          [i for i, _ in r["greedy"]] == [0, 1, 2] and len({t for _, t in r["greedy"]}) == 1, r["greedy"])
    check("node sdk: n 3 at temperature 1 with a seed, reproducible",
          r["seeded"][0] == r["seeded"][1] and len(r["seeded"][0]) == 3, r["seeded"])


def test_suffix_fills_in_the_middle(d):
    """suffix on a model with fill-in-the-middle tokens: the prompt runs as [BOS] PRE prompt SUF
    suffix MID (llama.cpp's infill order), the same as those ids sent as tokens."""
    c = d.client()
    tok = lambda text, bos: c.call({"op": "tokenize", "id": "t", "model": "fim", "text": text,
                                    "add_bos": bos})["tokens"]
    pre, suf = tok("def add(a, b):", True), tok("    return c", False)
    ids = pre[:1] + [300] + pre[1:] + [301] + suf + [302] if pre and pre[0] == 1 else \
        [300] + pre + [301] + suf + [302]
    a = c.call({"op": "generate", "id": 1, "model": "fim", "prompt": "def add(a, b):",
                "suffix": "    return c", "max_tokens": 6, "temperature": 0})
    b = c.call({"op": "generate", "id": 2, "model": "fim", "tokens": ids, "max_tokens": 6,
                "temperature": 0})
    c.close()
    check("suffix runs PRE prompt SUF suffix MID", a.get("event") == "done" and
          a["usage"]["prompt_tokens"] == len(ids) and a["text"] == b["text"], (a, b, ids))
    st, r = post(d, "/v1/completions", {"model": "fim", "prompt": "x = ", "suffix": "\n", "max_tokens": 3,
                                        "temperature": 0})
    check("HTTP completions take suffix on a fill-in-the-middle model", st == 200, r)


def test_n_holds_one_key_slot():
    """With API keys: a request with n = 3 holds one of its key's slots, released
    once at its end, and charges the prompt once plus every choice's tokens."""
    out = subprocess.run([os.path.join(gsd.BUILD, "gpuswap"), "keygen", "k", "--json"],
                         capture_output=True, text=True, check=True)
    key = json.loads(out.stdout)
    auth = ("auth:\n  http: true\n  keys:\n    - name: k\n      hash: \"%s\"\n"
            "      models: [\"*\"]\n      max_concurrent: 1\n" % key["hash"])
    d = HttpDaemon([("m", MODEL, "")], memory="8MiB", extra=auth)
    try:
        for rnd in range(2):  # a slot kept or released twice would show on the second round
            before = d.stats()["auth"]["keys"]["k"]
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=gsd.scaled(60))
            c.request("POST", "/v1/completions", body=json.dumps(
                {"model": "m", "prompt": "The cat", "max_tokens": 5, "n": 3, "temperature": 0}),
                headers={"Content-Type": "application/json", "Authorization": "Bearer " + key["key"]})
            r = c.getresponse()
            body = json.loads(r.read())
            c.close()
            after = d.stats()["auth"]["keys"]["k"]
            check("HTTP n 3 with a key, round %d: 200" % rnd, r.status == 200, body)
            check("HTTP n 3: one request, its tokens charged, no slot held (round %d)" % rnd,
                  after["total_requests"] == before["total_requests"] + 1 and
                  after["total_tokens"] == before["total_tokens"] + body["usage"]["total_tokens"] and
                  after["curr_inflight"] == 0, (before, after, body.get("usage")))
    finally:
        rc = d.stop()
    check("daemon with keys exits cleanly", rc == 0)


def main():
    fim = gsd.mkmodel(os.path.join(gsd.tmpdir("gsd-fim-"), "fim.gguf"),
                      "--extra-u32 tokenizer.ggml.fim_pre_token_id=300 "
                      "--extra-u32 tokenizer.ggml.fim_suf_token_id=301 "
                      "--extra-u32 tokenizer.ggml.fim_mid_token_id=302")
    d = HttpDaemon([("m", MODEL, "chat_template: chatml"), ("fim", fim, "")], memory="8MiB")
    try:
        test_top_logprobs_match_llama_cpp(d)
        test_stream_logprobs(d)
        test_n_choices(d)
        test_n_runs_in_one_batch(d)
        test_n_stream_cancel_and_errors(d)
        test_logit_bias_and_echo(d)
        test_suffix_fills_in_the_middle(d)
        test_openai_node_sdk(d)
    finally:
        rc = d.stop()
    check("daemon exits cleanly", rc == 0, open(d.log_path).read()[-2000:])
    test_n_holds_one_key_slot()
    if FAILED:
        print("%d failed" % len(FAILED))
        sys.exit(1)


if __name__ == "__main__":
    main()
