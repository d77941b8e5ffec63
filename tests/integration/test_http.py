"""The OpenAI-compatible HTTP front end of the real daemon (sim backend): completions and chat, streaming, errors, /v1/models, /health and /ready, /metrics (promtool), disconnects and draining, over curl and http.client."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-http-models-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODELS = [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 1)), "")
          for i in range(3)]
# about 8 ms a token with one thread: long enough to act while a request runs;
# greedy on BIG_PROMPT runs past BIG_TOKENS without an end-of-sequence (seed 10, F16 KV cache)
BIG = [("big", gsd.mkmodel(os.path.join(TMP, "big.gguf"),
                           "--type f16 --dim 512 --layers 8 --heads 8 --kv-heads 4 --ff 1536 "
                           "--vocab 400 --seed 10"), "")]
BIG_PROMPT, BIG_TOKENS = "hello world", 300
POOL = "4MiB"  # holds two of MODELS: three of them evict
PROMPTS = ["Once upon a time", "The cat", "hello world"]


class HttpDaemon(gsd.Daemon):
    """gsd.Daemon with listen.http on a free loopback port (and more listen keys)."""

    def __init__(self, models, listen="", **kw):
        self.port = gsd.free_port()
        super().__init__(models, listen="http: 127.0.0.1:%d\n%s" % (self.port, listen), **kw)
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("no HTTP listener:\n" + self.logtext())
                time.sleep(0.02)

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)


# ------------------------------------------------------------------ clients

def py_request(d, method, path, body=None, raw=None, timeout=60):
    """http.client: (status, headers dict lower-cased, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        c.request(method, path, body=data, headers=hdrs)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def curl(d, method, path, body=None, raw=None, extra=()):
    """curl: (status, body bytes)."""
    args = ["curl", "-sS", "-N", "-X", method, "-o", "-", "-w", "\n@@%{http_code}", d.url(path)]
    if body is not None or raw is not None:
        data = raw if raw is not None else json.dumps(body).encode()
        args += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    else:
        data = None
    out = subprocess.run(args + list(extra), input=data, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text, _, code = out.stdout.rpartition(b"\n@@")
    return int(code), text


def sse_events(data):
    """The data: payloads of an event stream, in order (the last should be [DONE])."""
    events = []
    for block in data.decode().split("\n\n"):
        block = block.strip("\n")
        if not block:
            continue
        assert block.startswith("data: "), repr(block)
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream_text(events, chat):
    """Checks the shape of a completed stream; returns (text, finish_reason, chunks)."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [e for e in events[:-1] if e.get("choices")]
    obj = "chat.completion.chunk" if chat else "text_completion"
    text, finish = "", None
    for i, e in enumerate(chunks):
        assert e["object"] == obj and e["id"] == chunks[0]["id"], e
        ch = e["choices"][0]
        assert finish is None, "a chunk after the finish_reason: %r" % e
        if chat:
            if i == 0:
                assert ch["delta"].get("role") == "assistant", e
            text += ch["delta"].get("content", "")
        else:
            text += ch["text"]
        finish = ch["finish_reason"]
    assert finish is not None, "no final chunk with finish_reason"
    return text, finish, chunks


def check_error(status, body, want_status, want_code):
    assert status == want_status, (status, body)
    err = json.loads(body)["error"]
    assert err["code"] == want_code, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] in ("invalid_request_error", "rate_limit_error", "server_error"), err
    assert "param" in err, err
    return err


def raw_send(d, method, path, body):
    """A raw socket with one request written (the caller reads or closes)."""
    s = socket.create_connection(("127.0.0.1", d.port), 10)
    data = json.dumps(body).encode()
    s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (method, path, len(data))).encode() + data)
    return s


def raw_read_until(s, marker, timeout=30):
    s.settimeout(timeout)
    buf = b""
    while marker not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError("closed before %r: %r" % (marker, buf[-200:]))
        buf += chunk
    return buf


def raw_status(s, timeout=60):
    """Reads one whole response with a Content-Length; (status, headers text, body)."""
    buf = raw_read_until(s, b"\r\n\r\n", timeout)
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, head.decode(), rest


def wait_until(fn, timeout=10):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() > deadline:
            return v
        time.sleep(0.05)


# ------------------------------------------------------------------ tests

def test_greedy_completions_equal_generate_over_http_client_and_curl():
    d = HttpDaemon(MODELS[:1], memory=POOL)
    try:
        name, path, _ = MODELS[0]
        for p in PROMPTS:
            want = gsd.generate_cli(path, p, 12)
            req = {"model": name, "prompt": p, "max_tokens": 12, "temperature": 0}
            for client in ("http.client", "curl"):
                if client == "curl":
                    status, body = curl(d, "POST", "/v1/completions", req)
                else:
                    status, hdrs, body = py_request(d, "POST", "/v1/completions", req)
                    assert hdrs["content-type"].startswith("application/json"), hdrs
                assert status == 200, (client, status, body)
                a = json.loads(body)
                assert a["object"] == "text_completion" and a["id"].startswith("cmpl-"), a
                assert a["model"] == name and isinstance(a["created"], int), a
                ch = a["choices"]
                assert len(ch) == 1 and ch[0]["index"] == 0, a
                assert ch[0]["text"] == want["text"], (client, p, ch[0]["text"], want["text"])
                assert ch[0]["finish_reason"] == "length", a
                u = a["usage"]
                assert u["prompt_tokens"] == len(want["prompt_ids"]) and u["completion_tokens"] == 12, u
                assert u["total_tokens"] == u["prompt_tokens"] + 12, u
            # streaming: the chunks add up to the same text
            sreq = dict(req, stream=True, stream_options={"include_usage": True})
            status, body = curl(d, "POST", "/v1/completions", sreq)
            assert status == 200, body
            events = sse_events(body)
            text, finish, _ = stream_text(events, chat=False)
            assert text == want["text"] and finish == "length", (text, want["text"], finish)
            usage = [e for e in events[:-1] if not e.get("choices")]
            assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 12, usage
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
            c.request("POST", "/v1/completions", body=json.dumps(dict(req, stream=True)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
            text, _, _ = stream_text(sse_events(r.read()), chat=False)
            c.close()
            assert text == want["text"], (text, want["text"])
        # prompt as an array of one string and as token ids
        want = gsd.generate_cli(path, PROMPTS[0], 6)
        for prompt in ([PROMPTS[0]], want["prompt_ids"], [want["prompt_ids"]]):
            status, _, body = py_request(d, "POST", "/v1/completions",
                                         {"model": name, "prompt": prompt, "max_tokens": 6,
                                          "temperature": 0, "n": 1, "user": "u", "logprobs": None,
                                          "frequency_penalty": 0, "presence_penalty": 0})
            assert status == 200, body
            assert json.loads(body)["choices"][0]["text"] == want["text"], (prompt, body)
        # HTTP/1.1 keep-alive: several requests on one connection
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
        for _ in range(3):
            c.request("POST", "/v1/completions", body=json.dumps(
                {"model": name, "prompt": "x", "max_tokens": 2, "temperature": 0}))
            r = c.getresponse()
            assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 2
        c.close()
    finally:
        assert d.stop() == 0


def test_chat_completions_with_and_without_streaming_equal_the_socket_chat():
    d = HttpDaemon(MODELS[:1], memory=POOL)
    try:
        name = MODELS[0][0]
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
        c = d.client()
        want = c.call({"op": "chat", "id": 1, "model": name, "messages": msgs, "max_tokens": 10,
                       "temperature": 0})
        c.close()
        assert want["event"] == "done", want
        req = {"model": name, "messages": msgs, "max_tokens": 10, "temperature": 0}
        status, _, body = py_request(d, "POST", "/v1/chat/completions", req)
        assert status == 200, body
        a = json.loads(body)
        assert a["object"] == "chat.completion" and a["id"].startswith("chatcmpl-"), a
        msg = a["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": want["text"]}, (msg, want)
        fr = {"length": "length", "stop": "stop", "eos": "stop"}[want["finish_reason"]]
        assert a["choices"][0]["finish_reason"] == fr, a
        assert a["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"], a
        status, body = curl(d, "POST", "/v1/chat/completions", req)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == want["text"]
        # streaming, over both clients; content parts and the developer role map as documented
        sreq = dict(req, stream=True, messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hello"}], "name": "me"}])
        status, body = curl(d, "POST", "/v1/chat/completions", sreq)
        assert status == 200, body
        text, finish, _ = stream_text(sse_events(body), chat=True)
        assert text == want["text"] and finish == fr, (text, want)
        cn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
        cn.request("POST", "/v1/chat/completions", body=json.dumps(dict(req, stream=True)))
        r = cn.getresponse()
        assert r.status == 200
        lines = []
        while True:  # read as it comes, line by line
            line = r.readline()
            if not line:
                break
            lines.append(line)
        cn.close()
        text, _, _ = stream_text(sse_events(b"".join(lines)), chat=True)
        assert text == want["text"], (text, want["text"])
    finally:
        assert d.stop() == 0


def test_models_and_health():
    d = HttpDaemon(MODELS[:2], memory=POOL)
    try:
        for client in ("http.client", "curl"):
            if client == "curl":
                status, body = curl(d, "GET", "/v1/models")
            else:
                status, _, body = py_request(d, "GET", "/v1/models")
            assert status == 200, body
            a = json.loads(body)
            assert a["object"] == "list", a
            assert [m["id"] for m in a["data"]] == ["m0", "m1"], a
            for m in a["data"]:
                assert m["object"] == "model" and m["owned_by"] == "gpuswapd", m
                assert isinstance(m["created"], int), m
        status, _, body = py_request(d, "GET", "/v1/models/m1")
        assert status == 200 and json.loads(body)["id"] == "m1", body
        check_error(*py_request(d, "GET", "/v1/models/nope")[::2], 404, "unknown_model")
        status, hdrs, body = py_request(d, "GET", "/health")
        assert status == 200 and json.loads(body) == {"status": "ok"}, body
        assert hdrs["content-type"].startswith("application/json"), hdrs
        status, body = curl(d, "GET", "/health")
        assert status == 200 and json.loads(body) == {"status": "ok"}, body
        assert py_request(d, "HEAD", "/health")[0] == 200
        status, hdrs, body = py_request(d, "GET", "/ready")
        assert status == 200 and json.loads(body)["status"] == "ready", body
        assert hdrs["content-type"].startswith("application/json"), hdrs
        assert py_request(d, "HEAD", "/ready")[0] == 200
    finally:
        assert d.stop() == 0


def test_ready_is_503_with_a_reason_while_a_model_is_not_in_host_ram_then_200_after_a_fixing_reload():
    tmp = gsd.tmpdir(prefix="gsd-http-ready-")
    bad = os.path.join(tmp, "bad.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF not really")
    d = HttpDaemon(MODELS[:1] + [("bad", bad, "")], memory=POOL)
    try:
        status, _, body = py_request(d, "GET", "/ready")
        a = json.loads(body)
        assert status == 503 and a["status"] == "failed" and "'bad'" in a["reason"], (status, a)
        # liveness is unaffected, and the loaded model serves
        assert py_request(d, "GET", "/health")[0] == 200
        status, _, body = py_request(d, "POST", "/v1/completions",
                                     {"model": "m0", "prompt": "hi", "max_tokens": 2})
        assert status == 200, body
        shutil.copyfile(MODELS[1][1], bad)
        assert d.admin_call({"op": "reload", "id": "r"})["ok"]
        got = wait_until(lambda: (lambda a: a if a[0] == 200 else None)(
            py_request(d, "GET", "/ready")), timeout=gsd.scaled(10))
        assert got and json.loads(got[2])["status"] == "ready", got
    finally:
        assert d.stop() == 0
        shutil.rmtree(tmp, ignore_errors=True)


def test_admin_drain_flips_ready_at_once_while_health_stays_200():
    d = HttpDaemon(BIG, memory="128MiB", page="2MiB")
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    try:
        assert py_request(d, "GET", "/ready")[0] == 200
        c.request("POST", "/v1/completions", body=json.dumps(
            {"model": "big", "prompt": BIG_PROMPT, "max_tokens": BIG_TOKENS, "temperature": 0,
             "stream": True}))
        r = c.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        a = gsd.Client(d.admin)
        a.send({"op": "drain", "id": "d"})
        # /ready flips as the loop hands the drain over, long before the stream ends
        got = wait_until(lambda: (lambda a: a if a[0] == 503 else None)(
            py_request(d, "GET", "/ready")), timeout=gsd.scaled(2))
        assert got and json.loads(got[2])["status"] == "draining", got
        assert d.proc.poll() is None
        status, _, body = py_request(d, "GET", "/health")
        assert status == 200 and json.loads(body) == {"status": "draining"}, body
        rest = r.read()
        assert rest.rstrip().endswith(b"data: [DONE]"), rest[-200:]
        assert a.final("d")[0]["ok"]
        a.close()
        assert d.proc.wait(gsd.scaled(30)) == 0
    finally:
        c.close()
        d.stop()


def test_error_statuses_in_openai_shape():
    d = HttpDaemon(MODELS[:2], memory=POOL, listen="max_line: 4KiB",
                   scheduler="max_batch: 1\nqueue_limit: 2\nmax_queued: 4")
    try:
        url = "/v1/completions"
        ok = {"model": "m0", "prompt": "x", "max_tokens": 2, "temperature": 0}
        for client in ("http.client", "curl"):
            def call(method, path, body=None, raw=None):
                if client == "curl":
                    return curl(d, method, path, body=body, raw=raw)
                s, _, b = py_request(d, method, path, body=body, raw=raw)
                return s, b
            check_error(*call("POST", url, raw=b"{not json"), 400, "bad_json")
            check_error(*call("POST", url, raw=b""), 400, "bad_json")
            check_error(*call("POST", url, raw=b"[1,2]"), 400, "bad_request")
            e = check_error(*call("POST", url, dict(ok, max_token=3)), 400, "bad_request")
            assert "max_token" in e["message"], e
            e = check_error(*call("POST", url, dict(ok, top_p=1.5)), 400, "bad_request")
            assert "top_p" in e["message"], e
            e = check_error(*call("POST", url, dict(ok, n=17)), 400, "bad_request")
            assert "'n'" in e["message"], e
            check_error(*call("POST", url, dict(ok, logprobs=21)), 400, "bad_request")
            check_error(*call("POST", url, dict(ok, best_of=2)), 400, "bad_request")
            check_error(*call("POST", url, dict(ok, prompt=["a", "b"])), 400, "bad_request")
            check_error(*call("POST", "/v1/chat/completions",
                              {"model": "m0", "messages": [{"role": "tool", "content": "x"}]}),
                        400, "bad_request")
            check_error(*call("POST", url, dict(ok, max_tokens=100000)), 400, "context_overflow")
            e = check_error(*call("POST", url, dict(ok, model="nope")), 404, "unknown_model")
            assert "m0" in e["message"], e
            check_error(*call("GET", "/v1/nothing"), 404, "bad_request")
            check_error(*call("GET", url), 405, "bad_request")
            # a body over listen.max_line (4 KiB): our 413; far over it: evhttp's 413
            big = dict(ok, prompt="x" * 5000)
            check_error(*call("POST", url, big), 413, "too_large")
            status, _ = call("POST", url, dict(ok, prompt="x" * 50000))
            assert status == 413, status
            # still serving
            status, body = call("POST", url, ok)
            assert status == 200, body
        # 503: one running (max_batch 1) and two queued per model; the rest are refused
        socks = [raw_send(d, "POST", url, {"model": "m1", "prompt": "hello", "max_tokens": 200,
                                           "temperature": 0}) for _ in range(8)]
        results = [raw_status(s) for s in socks]
        for s in socks:
            s.close()
        statuses = [r[0] for r in results]
        assert 503 in statuses and 200 in statuses, statuses
        for status, head, body in results:
            if status == 503:
                check_error(status, body, 503, "overloaded")
                assert "retry-after: 1" in head.lower(), head
        # every one went through the server's error emitter and was counted
        st = d.stats()["server"]
        for code in ("bad_json", "bad_request", "unknown_model", "context_overflow", "too_large",
                     "overloaded"):
            assert st["total_errors_" + code] >= 1, (code, st)
    finally:
        assert d.stop() == 0


def test_a_client_disconnecting_cancels_its_request():
    d = HttpDaemon(BIG, memory="128MiB", page="2MiB")
    try:
        # mid-stream
        s = raw_send(d, "POST", "/v1/completions", {"model": "big", "prompt": BIG_PROMPT,
                                                    "max_tokens": BIG_TOKENS, "temperature": 0,
                                                    "stream": True})
        raw_read_until(s, b"data: ")
        s.close()
        m = wait_until(lambda: (lambda m: m if m["total_cancelled"] == 1 and m["curr_kv_seqs"] == 0
                                else None)(d.stats()["models"]["big"]))
        assert m, d.stats()["models"]["big"]
        assert m["total_completed"] == 0 and m["curr_kv_bytes"] == 0, m
        # while waiting for a non-streamed answer
        s = raw_send(d, "POST", "/v1/completions", {"model": "big", "prompt": BIG_PROMPT,
                                                    "max_tokens": BIG_TOKENS, "temperature": 0})
        wait_until(lambda: d.stats()["models"]["big"]["total_requests"] == 2)
        s.close()
        m = wait_until(lambda: (lambda m: m if m["total_cancelled"] == 2 and m["curr_kv_seqs"] == 0
                                else None)(d.stats()["models"]["big"]))
        assert m and m["total_completed"] == 0, d.stats()["models"]["big"]
        # and everyone else is served
        status, _, body = py_request(d, "POST", "/v1/completions",
                                     {"model": "big", "prompt": "hi", "max_tokens": 2})
        assert status == 200, body
    finally:
        assert d.stop() == 0


def test_ready_503_and_requests_503_while_draining_and_the_running_stream_completes():
    d = HttpDaemon(BIG, memory="128MiB", page="2MiB")
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "big", "prompt": BIG_PROMPT, "max_tokens": BIG_TOKENS, "temperature": 0,
         "stream": True, "stream_options": {"include_usage": True}}))
    r = c.getresponse()
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: "), first
    d.signal(signal.SIGTERM)
    ready = wait_until(lambda: (lambda a: a if a[0] == 503 else None)(
        py_request(d, "GET", "/ready")), timeout=5)
    assert ready and json.loads(ready[2])["status"] == "draining", ready
    # liveness: still 200 while draining
    status, _, body = py_request(d, "GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "draining"}, body
    check_error(*py_request(d, "POST", "/v1/completions",
                            {"model": "big", "prompt": "x", "max_tokens": 2})[::2],
                503, "shutting_down")
    status, body = curl(d, "POST", "/v1/chat/completions",
                        {"model": "big", "messages": [{"role": "user", "content": "x"}]})
    check_error(status, body, 503, "shutting_down")
    events = sse_events(first + r.read())
    c.close()
    _, finish, _ = stream_text(events, chat=False)
    usage = [e for e in events[:-1] if not e.get("choices")]
    assert finish == "length" and usage[0]["usage"]["completion_tokens"] == BIG_TOKENS, events[-3:]
    assert d.proc.wait(30) == 0
    d.log.close()


def stats_hists():
    """(report key, metric) of every histogram in daemon/worker/stats.h's STATS_HISTS, the one list."""
    src = open(os.path.join(gsd.ROOT, "daemon", "worker", "stats.h")).read()
    block = re.search(r"#define STATS_HISTS\(X\)(.*?)\n\n", src, re.S).group(1)
    hists = [("hist_%s_ms" % f, metric) for f, metric in re.findall(r'X\((\w+),\s*"(\w+)"', block)]
    assert len(hists) >= 4 and ("hist_latency_ms", "latency_seconds") in hists, hists
    return hists


def test_metrics_pass_promtool_and_match_the_stats_report():
    hists = stats_hists()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (make test's deps step)"
    d = HttpDaemon(MODELS, memory=POOL)
    try:
        for name, _, _ in MODELS + MODELS[:1]:  # three models in a pool for two: evictions
            status, _, body = py_request(d, "POST", "/v1/completions",
                                         {"model": name, "prompt": "Once", "max_tokens": 4})
            assert status == 200, body
        status, hdrs, body = py_request(d, "GET", "/metrics")
        assert status == 200, body
        assert hdrs["content-type"].startswith("text/plain; version=0.0.4"), hdrs
        status, body2 = curl(d, "GET", "/metrics")
        assert status == 200
        st = d.stats()
        for text in (body, body2):
            out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
            assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out
        text = body2.decode()
        samples = {}
        for line in text.splitlines():
            if line.startswith("#"):
                assert line.startswith("# HELP gpuswapd_") or line.startswith("# TYPE gpuswapd_"), line
                continue
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
        models = st["models"]
        for name, _, _ in MODELS:
            m = models[name]
            lab = 'model="%s"' % name
            assert samples["gpuswapd_page_ins_total{%s}" % lab] == m["total_page_ins"], name
            assert samples["gpuswapd_requests_total{%s}" % lab] == m["total_requests"], name
            assert samples["gpuswapd_resident_bytes{%s}" % lab] == m["curr_resident_bytes"], name
            for cause in ("capacity", "quota", "admin", "preemption"):
                assert samples['gpuswapd_evictions_total{%s,cause="%s"}' % (lab, cause)] == \
                    m["evictions_" + cause], (name, cause)
            # every histogram of the report, by the one list in stats.h
            assert sorted(k for k in m if k.startswith("hist_")) == sorted(k for k, _ in hists), (name, m.keys())
            for key, metric in hists:
                h = m[key]
                base = "gpuswapd_%s" % metric
                assert samples["%s_count{%s}" % (base, lab)] == h["count"], (name, metric)
                assert abs(samples["%s_sum{%s}" % (base, lab)] - h["sum_ms"] / 1e3) < 1e-6
                buckets = [(k, v) for k, v in samples.items()
                           if k.startswith(base + "_bucket{" + lab + ",")]
                assert len(buckets) == 96 and buckets[-1][0].endswith('le="+Inf"}'), buckets[-2:]
                vals = [v for _, v in buckets]
                assert vals == sorted(vals) and vals[-1] == h["count"], (name, metric)
        assert sum(models[n]["evictions_capacity"] for n in models) > 0, models
        pool = st["pool"]
        assert samples['gpuswapd_pool_pages{state="used"}'] == pool["curr_pool_used"]
        assert samples['gpuswapd_pool_pages{state="free"}'] == pool["curr_pool_free"]
        assert samples['gpuswapd_errors_total{code="bad_request"}'] == \
            st["server"]["total_errors_bad_request"]
        for family in ("page_ins_total", "evictions_total", "resident_bytes", "pool_pages") + \
                tuple(metric for _, metric in hists):
            assert text.count("# TYPE gpuswapd_%s " % family) == 1, family
            assert text.count("# HELP gpuswapd_%s " % family) == 1, family
        # no histogram but those, each once (latency was missing)
        families = re.findall(r"^# TYPE gpuswapd_(\S+) histogram$", text, re.M)
        assert sorted(families) == sorted(metric for _, metric in hists), families
        assert "latency_seconds" in families
    finally:
        assert d.stop() == 0


def test_off_unless_configured():
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    try:
        assert "http on" not in d.logtext(), d.logtext()
        c = d.client()
        assert c.call({"op": "models", "id": 1})["ok"]
        c.close()
    finally:
        assert d.stop() == 0


def test_listeners_on_ipv6_loopback_in_brackets():
    """listen.http and listen.tcp take "[::1]:port" (config/hostport.c splits it for both listeners)."""
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        print("  skip: no IPv6")
        return
    hp, tp = gsd.free_port(), gsd.free_port()
    d = gsd.Daemon(MODELS[:1], memory=POOL, listen='http: "[::1]:%d"\ntcp: "[::1]:%d"' % (hp, tp))
    try:
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                socket.create_connection(("::1", hp), 1).close()
                break
            except OSError:
                assert d.proc.poll() is None and time.time() < deadline, d.logtext()
                time.sleep(0.02)
        c = http.client.HTTPConnection("::1", hp, timeout=30)
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["status"] == "ok"
        c.close()
        s = socket.create_connection(("::1", tp), 30)
        s.sendall(b'{"op":"models","id":6}\n')
        buf = b""
        while not buf.endswith(b"\n"):
            buf += s.recv(65536)
        s.close()
        ans = json.loads(buf)
        assert ans["id"] == 6 and ans["ok"] and ans["models"][0]["name"] == MODELS[0][0], ans
    finally:
        assert d.stop() == 0


def test_drain_linger_fails_ready_first_and_serves_until_it_ends():
    d = HttpDaemon(MODELS[:1], memory=POOL, listen="drain_linger: 1500ms")
    try:
        assert py_request(d, "GET", "/ready")[0] == 200
        t0 = time.time()
        a = gsd.Client(d.admin)
        a.send({"op": "drain", "id": "d"})
        got = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(
            py_request(d, "GET", "/ready")), timeout=gsd.scaled(1))
        assert got and json.loads(got[2])["status"] == "draining", got
        assert "drain_linger" in json.loads(got[2])["reason"], got
        # still serving while the load balancer takes the host out
        status, _, body = py_request(d, "POST", "/v1/completions",
                                     {"model": "m0", "prompt": "hi", "max_tokens": 2})
        linger_left = 1.5 - (time.time() - t0)
        assert status == 200 or linger_left < 0.2, (status, body, linger_left)
        assert py_request(d, "GET", "/health")[0] == 200
        # then it refuses (503 shutting_down, or gone once the drain is over), answers the
        # drain and exits; not before the linger ended
        def refused():
            try:
                r = py_request(d, "POST", "/v1/completions",
                               {"model": "m0", "prompt": "hi", "max_tokens": 2})
            except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
                return "gone"  # exited (a request that met the exit is cut)
            if r[0] == 200:
                return None
            assert r[0] == 503 and json.loads(r[2])["error"]["code"] == "shutting_down", r
            return "refused"
        assert wait_until(refused, timeout=gsd.scaled(5))
        assert time.time() - t0 >= 1.4, time.time() - t0
        assert a.final("d")[0]["ok"]
        a.close()
        assert d.proc.wait(gsd.scaled(30)) == 0
        assert "serving 1500 ms more before draining" in d.logtext()
    finally:
        d.stop()


# ------------------------------------------------------------------ inference-gateway metrics

PROM_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def prom_parse(text):
    """A strict reader of Prometheus text exposition 0.0.4 for what promtool cannot check
    (names with ':'): every sample belongs to a family whose HELP and TYPE come first, once;
    names and labels are well formed; values are floats. {(name, frozenset(labels)): value},
    {family: type}."""
    samples, types, helps = {}, {}, set()
    for line in text.splitlines():
        assert line, "blank line in the exposition"
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert PROM_NAME.match(name) and name not in helps, line
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            assert name in helps and name not in types, line
            assert typ in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = typ
            continue
        assert not line.startswith("#"), line
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        assert m, "malformed sample: %r" % line
        name, labels_text, value = m.group(1), m.group(3), float(m.group(4))
        fam = next((f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name)) if f in types),
                   None)
        assert fam, "sample before its TYPE: %r" % line
        labels, rest = {}, labels_text or ""
        while rest:
            lm = PROM_LABEL.match(rest)
            assert lm, "malformed labels in %r" % line
            labels[lm.group(1)] = lm.group(2)
            rest = rest[lm.end():]
        key = (name, frozenset(labels.items()))
        assert key not in samples, "duplicate sample %r" % line
        samples[key] = value
    return samples, types


def gauge(samples, name):
    got = [(dict(k[1]), v) for k, v in samples.items() if k[0] == name]
    assert len(got) == 1, (name, got)
    return got[0]


class GatewayDaemon(HttpDaemon):
    """HttpDaemon with metrics.vllm_compat, metrics.listen and copies throttled to bw."""

    def __init__(self, models, bw, **kw):
        self.metrics_port, self.bw = gsd.free_port(), bw
        super().__init__(models, extra="metrics:\n  vllm_compat: true\n  listen: 127.0.0.1:%d\n"
                         % self.metrics_port, **kw)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        with open(self.config) as f:
            text = f.read()
        with open(self.config, "w") as f:
            f.write(text.replace("  threads: 1\n", "  threads: 1\n  sim_bandwidth: %s\n" % self.bw, 1))

    def scrape(self):
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            assert r.status == 200, r.status
            return r.read().decode()
        finally:
            c.close()


def check_gateway(text, st):
    """The three gateway gauges under both names agree with each other and with the stats
    report st taken right after: returns (running, waiting, max) as lists and an int."""
    samples, types = prom_parse(text)
    for name in ("vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
                 "vllm:lora_requests_info", "gpuswapd_requests_waiting",
                 "gpuswapd_kv_cache_usage_ratio", "gpuswapd_models_info"):
        assert types.get(name) == "gauge", name
    waiting = gauge(samples, "vllm:num_requests_waiting")[1]
    assert waiting == gauge(samples, "gpuswapd_requests_waiting")[1]
    kv = gauge(samples, "vllm:gpu_cache_usage_perc")[1]
    assert kv == gauge(samples, "vllm:kv_cache_usage_perc")[1] == \
        gauge(samples, "gpuswapd_kv_cache_usage_ratio")[1] and 0 <= kv <= 1, kv
    lora, ts = gauge(samples, "vllm:lora_requests_info")
    own, ts2 = gauge(samples, "gpuswapd_models_info")
    assert abs(ts - time.time()) < 60 and ts == ts2, (ts, ts2)
    assert (lora["running_lora_adapters"], lora["waiting_lora_adapters"], lora["max_lora"]) == \
        (own["running_models"], own["waiting_models"], own["max_models"]), (lora, own)
    split = lambda v: v.split(",") if v else []  # noqa: E731 -- the picker's own split, no spaces
    running, waiting_models = split(lora["running_lora_adapters"]), split(lora["waiting_lora_adapters"])
    # max: how many of the models fit in the pool together, smallest first
    pool = st["pool"]["curr_pool_pages"] * st["pool"]["page_size"]
    fit, total = 0, 0
    for b in sorted(m["weight_bytes"] for m in st["models"].values()):
        if total + b > pool:
            break
        total, fit = total + b, fit + 1
    assert int(lora["max_lora"]) == fit, (lora, fit)
    return running, waiting_models, int(waiting)


def test_gateway_metrics_with_vllm_compat_while_resident_waiting_and_after_an_eviction():
    d = GatewayDaemon(MODELS, bw="2MiB", memory=POOL)
    try:
        # resident: m0 served, nothing queued
        status, _, body = py_request(d, "POST", "/v1/completions",
                                     {"model": "m0", "prompt": "Once", "max_tokens": 2})
        assert status == 200, body
        running, waiting, nwait = check_gateway(d.scrape(), d.stats())
        assert running == ["m0"] and waiting == [] and nwait == 0, (running, waiting, nwait)
        # waiting: a request for m1 queued while m1 pages in (about a second at 2 MiB/s)
        done = {}
        t = threading.Thread(target=lambda: done.update(r=py_request(
            d, "POST", "/v1/completions", {"model": "m1", "prompt": "Once", "max_tokens": 2})))
        t.start()
        seen = wait_until(lambda: (lambda g: g if "m1" in g[1] else None)(
            check_gateway(d.scrape(), d.stats())), timeout=gsd.scaled(10))
        assert seen and seen[0] == ["m0"] and seen[1] == ["m1"] and seen[2] == 1, seen
        t.join(gsd.scaled(60))
        assert done["r"][0] == 200, done
        running, waiting, nwait = check_gateway(d.scrape(), d.stats())
        assert sorted(running) == ["m0", "m1"] and waiting == [] and nwait == 0, (running, waiting)
        # after an eviction: m2 takes m0's place (the pool holds two)
        status, _, body = py_request(d, "POST", "/v1/completions",
                                     {"model": "m2", "prompt": "Once", "max_tokens": 2})
        assert status == 200, body
        st = d.stats()
        running, waiting, nwait = check_gateway(d.scrape(), st)
        evicted = [n for n, m in st["models"].items() if m["evictions_capacity"] > 0]
        assert evicted and all(n not in running for n in evicted) and "m2" in running, \
            (running, evicted)
        assert sorted(running) == sorted(n for n, m in st["models"].items()
                                         if m["state"] == "resident"), (running, st["models"])
        # the default families still pass promtool once the vLLM-named lines are left out
        promtool = shutil.which("promtool")
        assert promtool, "promtool is missing: apt-get install prometheus"
        text = d.scrape()
        plain = "\n".join(l for l in text.splitlines() if "vllm:" not in l) + "\n"
        out = subprocess.run([promtool, "check", "metrics"], input=plain.encode(), capture_output=True)
        assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out
        # the metrics listener serves /metrics and /health only; the main one has /metrics too
        c = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=30)
        c.request("POST", "/v1/completions", body=b"{}")
        r = c.getresponse()
        assert r.status == 404, r.status
        r.read()
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        c.close()
        status, _, body = py_request(d, "GET", "/metrics")
        assert status == 200 and b"vllm:lora_requests_info{" in body
    finally:
        assert d.stop() == 0


def test_default_metrics_have_the_gateway_gauges_under_gpuswapd_names_only():
    d = HttpDaemon(MODELS[:1], memory=POOL)
    try:
        status, _, body = py_request(d, "GET", "/metrics")
        assert status == 200
        text = body.decode()
        assert "vllm:" not in text, "vLLM names without metrics.vllm_compat"
        samples, types = prom_parse(text)
        assert gauge(samples, "gpuswapd_requests_waiting")[1] == 0
        info = gauge(samples, "gpuswapd_models_info")[0]
        assert info == {"running_models": "", "waiting_models": "", "max_models": "1"}, info
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_greedy_completions_equal_generate_over_http_client_and_curl,
               test_chat_completions_with_and_without_streaming_equal_the_socket_chat,
               test_models_and_health,
               test_error_statuses_in_openai_shape,
               test_a_client_disconnecting_cancels_its_request,
               test_ready_503_and_requests_503_while_draining_and_the_running_stream_completes,
               test_ready_is_503_with_a_reason_while_a_model_is_not_in_host_ram_then_200_after_a_fixing_reload,
               test_admin_drain_flips_ready_at_once_while_health_stays_200,
               test_drain_linger_fails_ready_first_and_serves_until_it_ends,
               test_metrics_pass_promtool_and_match_the_stats_report,
               test_gateway_metrics_with_vllm_compat_while_resident_waiting_and_after_an_eviction,
               test_default_metrics_have_the_gateway_gauges_under_gpuswapd_names_only,
               test_off_unless_configured,
               test_listeners_on_ipv6_loopback_in_brackets]:
        r.run(fn)
    sys.exit(r.exit_code())
