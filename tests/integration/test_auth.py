"""API keys on the real daemon (sim backend) over its real HTTP and TCP sockets: no key, a wrong key, a NUL byte after a valid key (HTTP header, TCP key), a missing TCP key counted, a key revoked by a reload, a key limited to one model (answered as an unknown model), a rate-limited key bursting, concurrent-limit overflow, a spent tokens-per-minute budget, the back-off keyed by X-Forwarded-For from a trusted proxy, per-key usage in stats and /metrics, the CLI's --api-key, the OpenAI Node SDK, and no key material in any log or metrics."""
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

TMP = gsd.tmpdir(prefix="gsd-auth-models-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODELS = [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 1)), "")
          for i in range(2)]
# about 8 ms a token with one thread: a request stays in flight long enough to overflow a limit
SLOW = ("slow", gsd.mkmodel(os.path.join(TMP, "slow.gguf"),
                            "--type f16 --dim 512 --layers 8 --heads 8 --kv-heads 4 --ff 1536 --vocab 400 --seed 7"), "")
GPUSWAP = os.path.abspath(os.path.join(gsd.BUILD, "gpuswap"))
NODE_DIR = os.path.join(gsd.ROOT, "tests", "node")

SECRETS = []  # every key drawn in this run: none may show up in a log or in metrics


def keygen(name):
    out = subprocess.run([GPUSWAP, "keygen", name, "--json"], capture_output=True, text=True, check=True)
    k = json.loads(out.stdout)
    assert k["key"].startswith("gsk_") and re.fullmatch(r"sha256:[0-9a-f]{64}", k["hash"]), k
    SECRETS.append(k["key"])
    return k


KEYS = {n: keygen(n) for n in ("alice", "bob", "carol", "dave", "eve", "frank")}
PROXY_KEYS = {n: keygen(n) for n in ("alice",)}


def key_entry(name, hash_, models, more=""):
    lines = ["  - name: %s" % name, "    hash: \"%s\"" % hash_, "    models: [%s]" % ", ".join('"%s"' % m for m in models)]
    lines += ["    " + l for l in more.strip().splitlines() if l.strip()]
    return "\n".join(lines)


def auth_section(entries, more=""):
    return "auth:\n  http: true\n  tcp: true\n" + "".join("  " + l + "\n" for l in more.strip().splitlines()) + \
        "  keys:\n" + "\n".join("  " + l for e in entries for l in e.splitlines()) + "\n"


MAIN_ENTRIES = [
    key_entry("alice", KEYS["alice"]["hash"], ["*"]),
    key_entry("bob", KEYS["bob"]["hash"], ["m0"]),
    key_entry("carol", KEYS["carol"]["hash"], ["*"], "rate: 0.5\nburst: 3"),
    key_entry("dave", KEYS["dave"]["hash"], ["*"], "max_concurrent: 1"),
    key_entry("eve", KEYS["eve"]["hash"], ["*"]),
    key_entry("frank", KEYS["frank"]["hash"], ["*"], "tokens_per_minute: 10"),
]


class AuthDaemon(gsd.Daemon):
    """gsd.Daemon with listen.http, listen.tcp and metrics.listen on free loopback ports, keys required on both."""

    def __init__(self, entries, auth_more="max_failures: 1000"):
        self.port, self.tcp_port, self.mport = gsd.free_port(), gsd.free_port(), gsd.free_port()
        self.entries, self.auth_more = entries, auth_more
        super().__init__(MODELS + [SLOW], memory="128MiB", page="2MiB",
                         listen="http: 127.0.0.1:%d\ntcp: 127.0.0.1:%d" % (self.port, self.tcp_port),
                         extra=self.extra())
        deadline = time.time() + gsd.scaled(10)
        for p in (self.port, self.tcp_port, self.mport):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", p), 1).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("no listener on %d:\n%s" % (p, self.logtext()))
                    time.sleep(0.02)

    def extra(self):
        return "metrics:\n  listen: 127.0.0.1:%d\n" % self.mport + auth_section(self.entries, self.auth_more)

    def rewrite(self, entries):
        self.entries = entries
        self.write_config(self.models, "128MiB", "2MiB", self.extra())


def request(port, method, path, body=None, key=None, headers=None, timeout=60):
    """(status, headers lower-cased, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=gsd.scaled(timeout))
    try:
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = "Bearer " + key
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            h["Content-Type"] = "application/json"
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        try:
            return r.status, hd, json.loads(raw)
        except ValueError:
            return r.status, hd, raw.decode(errors="replace")
    finally:
        c.close()


def complete(d, key, model="m0", n=4, **kw):
    return request(d.port, "POST", "/v1/completions",
                   {"model": model, "prompt": "Once upon a time", "max_tokens": n, "temperature": 0}, key=key, **kw)


def assert_ok(status, body, what):
    assert status == 200, "%s: %d %r" % (what, status, body)


def assert_error(status, body, want_status, code, what):
    assert status == want_status, "%s: %d %r" % (what, status, body)
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["code"] == code, "%s: %r" % (what, body)
    return e


class Tcp(gsd.Client):
    """A JSON-lines client on listen.tcp."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), gsd.scaled(timeout))
        self.sock.settimeout(gsd.scaled(timeout))
        self.buf = b""

    def auth(self, key, rid="a"):
        return self.call({"op": "auth", "id": rid, "key": key})

    def call_among(self, obj):
        """Sends obj and returns its final answer, passing over token events of other requests."""
        self.send(obj)
        while True:
            ev = self.recv()
            if ev.get("id") == obj.get("id") and ev.get("event") != "token":
                return ev
            assert ev.get("event") == "token", "unexpected final answer of another request: %r" % ev


def gen(rid, model="m0", n=4, **kw):
    return dict({"op": "generate", "id": rid, "model": model, "prompt": "Once upon a time", "max_tokens": n,
                 "temperature": 0}, **kw)


D = None


def daemon():
    global D
    if D is None:
        D = AuthDaemon(MAIN_ENTRIES)
    return D


# ------------------------------------------------------------------ tests

def test_no_key_is_401_and_unauthorized():
    d = daemon()
    st, hd, body = complete(d, None)
    e = assert_error(st, body, 401, "unauthorized", "no key")
    assert e["type"] == "invalid_request_error" and hd.get("www-authenticate") == "Bearer", (e, hd)
    st, _, body = request(d.port, "GET", "/v1/models")
    assert_error(st, body, 401, "unauthorized", "no key: /v1/models")
    st, _, body = request(d.port, "GET", "/metrics")
    assert_error(st, body, 401, "unauthorized", "no key: /metrics on listen.http")
    st, _, body = complete(d, None, headers={"Authorization": "Basic Zm9vOmJhcg=="})
    assert_error(st, body, 401, "unauthorized", "another scheme")
    for path in ("/health", "/ready"):  # stay open for load balancers
        st, _, body = request(d.port, "GET", path)
        assert st == 200, (path, st, body)
    c = Tcp(d.tcp_port)
    for rid, req in (("g", gen("g")), ("m", {"op": "models", "id": "m"})):
        ans = c.call(req)
        assert ans["event"] == "error" and ans["error"]["code"] == "unauthorized", ans
    ok = c.call({"op": "tokenize", "id": "t", "model": "m0", "text": "hi"})
    assert ok["error"]["code"] == "unauthorized", ok
    c.close()
    # the unix socket keeps file-mode access: no key needed
    u = d.client()
    assert u.call(gen("u"))["event"] == "done"
    u.close()
    # meanwhile alice sees no error
    st, _, body = complete(d, KEYS["alice"]["key"])
    assert_ok(st, body, "alice")


def test_wrong_key_is_401_and_unauthorized():
    d = daemon()
    wrong = KEYS["alice"]["key"][:-1] + ("0" if KEYS["alice"]["key"][-1] != "0" else "1")
    st, _, body = complete(d, wrong)
    assert_error(st, body, 401, "unauthorized", "wrong key")
    st, _, body = complete(d, KEYS["alice"]["hash"])  # the hash is not the key
    assert_error(st, body, 401, "unauthorized", "hash as key")
    c = Tcp(d.tcp_port)
    ans = c.auth(wrong)
    assert ans["event"] == "error" and ans["error"]["code"] == "unauthorized", ans
    assert c.call(gen("g"))["error"]["code"] == "unauthorized"
    ans = c.auth(KEYS["alice"]["key"])  # the connection stays usable
    assert ans.get("ok") is True and ans["key"] == "alice", ans
    assert c.call(gen("g2"))["event"] == "done"
    c.close()


class _SharedFile:
    """A socket stand-in whose makefile() is one shared buffered file, which a response's
    close leaves open: http.client reads pipelined responses one after another from it."""

    def __init__(self, f):
        self.f = f

    def makefile(self, *a, **k):
        return self

    def __getattr__(self, name):
        return getattr(self.f, name)

    def close(self):
        pass


def raw_http(port, requests, n_answers=None):
    """Sends raw request bytes (one sendall: pipelined) and reads that many answers: [(status, JSON)]."""
    s = socket.create_connection(("127.0.0.1", port), gsd.scaled(30))
    s.settimeout(gsd.scaled(30))
    try:
        s.sendall(b"".join(requests))
        f = s.makefile("rb")
        out = []
        for _ in range(n_answers or len(requests)):
            r = http.client.HTTPResponse(_SharedFile(f))
            r.begin()
            out.append((r.status, json.loads(r.read())))
        return out
    finally:
        s.close()


def raw_completion(auth_value, extra=b"", body=None):
    body = body if body is not None else json.dumps(
        {"model": "m0", "prompt": "Once", "max_tokens": 2, "temperature": 0}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: gsd\r\nAuthorization: " + auth_value + b"\r\n" + extra +
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def test_a_nul_byte_after_a_valid_key_in_the_authorization_header_is_refused():
    d = daemon()
    alice = KEYS["alice"]["key"].encode()
    ok = raw_completion(b"Bearer " + alice)
    # evhttp cuts a header at a NUL: "Bearer KEY\0junk" must not read as "Bearer KEY"
    for i, bad in enumerate((raw_completion(b"Bearer " + alice + b"\0junk"),
                             raw_completion(b"Bearer " + alice + b"\0"),
                             raw_completion(b"Bearer " + alice, extra=b"X-Forwarded-For: 10.0.0.1\0x\r\n"),
                             raw_completion(b"Bearer " + alice, body=b'{"model":"m0","prompt":"a\0"}'))):
        (st, body), = raw_http(d.port, [bad])  # (the message names no key material)
        assert st == 400 and body["error"]["code"] == "bad_request" and "NUL" in body["error"]["message"], \
            (i, st, body)
    # on one keep-alive connection, pipelined: only the request that holds the NUL is refused
    answers = raw_http(d.port, [ok, raw_completion(b"Bearer " + alice + b"\0junk"), ok, ok])
    assert [st for st, _ in answers] == [200, 400, 200, 200], answers
    assert answers[0][1]["choices"][0]["text"] == answers[2][1]["choices"][0]["text"], answers


def test_a_tcp_request_without_a_key_counts_as_missing():
    d = daemon()
    before = d.stats()["auth"]["listeners"]["tcp"]
    c = Tcp(d.tcp_port)
    ans = c.call(gen("nokey"))
    assert ans["id"] == "nokey" and ans["error"]["code"] == "unauthorized", ans
    ans = c.call({"op": "models", "id": "nokey2"})
    assert ans["id"] == "nokey2" and ans["error"]["code"] == "unauthorized", ans
    c.close()
    after = d.stats()["auth"]["listeners"]["tcp"]
    assert after["total_auth_missing"] == before["total_auth_missing"] + 2, (before, after)
    assert after["total_auth_invalid"] == before["total_auth_invalid"], (before, after)


def test_a_tcp_key_holding_a_nul_is_unauthorized_with_the_request_id():
    d = daemon()
    alice = KEYS["alice"]["key"]
    before = d.stats()["auth"]["listeners"]["tcp"]
    c = Tcp(d.tcp_port)
    # json.dumps sends the NUL as \u0000
    for rid, key in (("n1", alice + "\x00junk"), ("n2", alice + "\x00"), (3, "\x00" + alice)):
        ans = c.auth(key, rid=rid)
        assert ans["id"] == rid and ans["event"] == "error" and ans["error"]["code"] == "unauthorized", ans
    assert c.call(gen("g"))["error"]["code"] == "unauthorized"  # not authenticated by it
    after = d.stats()["auth"]["listeners"]["tcp"]
    assert after["total_auth_invalid"] == before["total_auth_invalid"] + 3, (before, after)
    ans = c.auth(alice, rid="ok")  # the connection stays usable
    assert ans.get("ok") is True and ans["id"] == "ok" and ans["key"] == "alice", ans
    assert c.call(gen("g2"))["event"] == "done"
    c.close()


def test_key_limited_to_one_model_sees_others_as_unknown():
    d = daemon()
    bob, alice = KEYS["bob"]["key"], KEYS["alice"]["key"]
    st, _, body = complete(d, bob, "m0")
    assert_ok(st, body, "bob m0")
    st1, _, forbidden = complete(d, bob, "m1")
    st2, _, unknown = complete(d, bob, "nosuch")
    assert_error(st1, forbidden, 404, "unknown_model", "bob m1")
    assert_error(st2, unknown, 404, "unknown_model", "bob nosuch")
    f, u = forbidden["error"], unknown["error"]
    assert f["message"].replace("'m1'", "'X'") == u["message"].replace("'nosuch'", "'X'"), (f, u)
    assert f["type"] == u["type"] and "m1" not in f["message"].replace("'m1'", ""), f
    assert "slow" not in f["message"], f
    st, _, body = request(d.port, "GET", "/v1/models", key=bob)
    assert_ok(st, body, "bob models")
    assert [m["id"] for m in body["data"]] == ["m0"], body
    st1, _, b1 = request(d.port, "GET", "/v1/models/m1", key=bob)
    st2, _, b2 = request(d.port, "GET", "/v1/models/nosuch", key=bob)
    assert st1 == st2 == 404 and b1["error"]["message"].replace("m1", "X") == \
        b2["error"]["message"].replace("nosuch", "X"), (b1, b2)
    st, _, body = request(d.port, "GET", "/v1/models", key=alice)
    assert sorted(m["id"] for m in body["data"]) == ["m0", "m1", "slow"], body
    c = Tcp(d.tcp_port)
    assert c.auth(bob)["key"] == "bob"
    assert [m["name"] for m in c.call({"op": "models", "id": 1})["models"]] == ["m0"]
    e1, e2 = c.call(gen("f", "m1")), c.call(gen("u", "nosuch"))
    assert e1["error"]["code"] == e2["error"]["code"] == "unknown_model", (e1, e2)
    assert e1["error"]["message"].replace("'m1'", "'X'") == e2["error"]["message"].replace("'nosuch'", "'X'")
    t1 = c.call({"op": "tokenize", "id": "t", "model": "m1", "text": "hi"})
    assert t1["error"]["code"] == "unknown_model", t1
    assert c.call(gen("ok", "m0"))["event"] == "done"
    c.close()


def test_rate_limited_key_bursting_gets_429_while_another_key_does_not():
    d = daemon()
    carol, alice = KEYS["carol"]["key"], KEYS["alice"]["key"]
    results, others = [], []
    for i in range(8):  # burst 3 at 0.5/s: the first 3 pass (4 or 5 on a slow machine), then 429s
        results.append(request(d.port, "GET", "/v1/models", key=carol))
        others.append(request(d.port, "GET", "/v1/models", key=alice))
    ok = [r for r in results if r[0] == 200]
    limited = [r for r in results if r[0] == 429]
    assert 3 <= len(ok) <= 5 and len(ok) + len(limited) == 8, [r[0] for r in results]
    for st, hd, body in limited:
        e = assert_error(st, body, 429, "rate_limited", "carol burst")
        assert int(hd["retry-after"]) >= 1 and "requests-per-second" in e["message"], (hd, e)
    assert all(st == 200 for st, _, _ in others), [o[0] for o in others]
    # the same key on TCP: typed rate_limited
    c = Tcp(d.tcp_port)
    assert c.auth(carol)["key"] == "carol"
    answers = [c.call({"op": "models", "id": i}) for i in range(6)]
    codes = [a.get("error", {}).get("code") for a in answers]
    assert "rate_limited" in codes and set(codes) <= {None, "rate_limited"}, codes
    c.close()
    time.sleep(2.2)  # refilled at 0.5/s
    st, _, body = request(d.port, "GET", "/v1/models", key=carol)
    assert_ok(st, body, "carol after refill")


def test_concurrent_limit_overflow_gets_429_while_another_key_does_not():
    d = daemon()
    dave, alice = KEYS["dave"]["key"], KEYS["alice"]["key"]
    # a long streaming request holds dave's one slot
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=gsd.scaled(120))
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": "slow", "prompt": "hello world", "max_tokens": 200, "temperature": 0, "stream": True}),
        headers={"Authorization": "Bearer " + dave, "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    first = r.readline()
    assert first.startswith(b"data: "), first
    st, hd, body = complete(d, dave)
    e = assert_error(st, body, 429, "rate_limited", "dave second")
    assert "concurrent" in e["message"] and hd.get("retry-after"), (e, hd)
    st, _, body = complete(d, alice)
    assert_ok(st, body, "alice while dave is at his limit")
    # TCP: the same key's slot is taken there too
    t = Tcp(d.tcp_port)
    assert t.auth(dave)["key"] == "dave"
    ans = t.call(gen("x"))
    assert ans["error"]["code"] == "rate_limited" and "concurrent" in ans["error"]["message"], ans
    # closing the stream cancels it; its slot comes back
    c.close()
    deadline = time.time() + gsd.scaled(30)
    while True:
        st, _, body = complete(d, dave)
        if st == 200:
            break
        assert st == 429 and time.time() < deadline, (st, body)
        time.sleep(0.05)
    ans = t.call(gen("y"))
    assert ans["event"] == "done", ans
    # on TCP: one in flight, a second overflows, a cancel frees the slot
    t.send(gen("long", "slow", 300, stream=True))
    assert t.recv()["event"] == "token"
    ans = t.call_among(gen("z"))
    assert ans["error"]["code"] == "rate_limited", ans
    # an error the server itself tags with the running request's id does not free its slot
    ans = t.call_among({"op": "generate", "id": "long", "model": "slow", "bogus": 1})
    assert ans["error"]["code"] == "bad_request", ans
    ans = t.call_among(gen("z2"))
    assert ans["error"]["code"] == "rate_limited", ans
    t.send({"op": "cancel", "id": "c", "target": "long"})
    seen = {}
    while len(seen) < 2:
        ev = t.recv()
        if ev.get("event") != "token":
            seen[ev["id"]] = ev
    assert t.call(gen("after"))["event"] == "done"
    t.close()


def test_tokens_per_minute_refuse_once_the_budget_is_spent():
    d = daemon()
    frank, alice = KEYS["frank"]["key"], KEYS["alice"]["key"]
    st, _, body = complete(d, frank, n=8)  # about 12 tokens of a budget of 10: admitted, then charged
    assert_ok(st, body, "frank first")
    assert body["usage"]["total_tokens"] > 10, body["usage"]
    st, hd, body = complete(d, frank)
    e = assert_error(st, body, 429, "rate_limited", "frank over budget")
    assert "tokens-per-minute" in e["message"] and int(hd["retry-after"]) >= 1, (e, hd)
    st, _, body = complete(d, alice, n=8)
    assert_ok(st, body, "alice meanwhile")
    st, _, body = request(d.port, "GET", "/v1/models", key=frank)  # uses no tokens: still served
    assert_ok(st, body, "frank models")


def test_revoked_key_after_reload_closes_its_connection():
    d = daemon()
    eve, alice = KEYS["eve"]["key"], KEYS["alice"]["key"]
    ce, ca = Tcp(d.tcp_port), Tcp(d.tcp_port)
    assert ce.auth(eve)["key"] == "eve" and ca.auth(alice)["key"] == "alice"
    assert ce.call(gen("e1"))["event"] == "done"
    st, _, body = complete(d, eve)
    assert_ok(st, body, "eve before")
    d.rewrite([e for e in MAIN_ENTRIES if "name: eve" not in e])
    d.signal(signal.SIGHUP)
    ev = ce.recv()
    assert ev["event"] == "error" and ev["error"]["code"] == "unauthorized" and "revoked" in ev["error"]["message"], ev
    try:
        more = ce.recv()
        raise AssertionError("the revoked key's connection stayed open: %r" % more)
    except (EOFError, ConnectionResetError):
        pass
    ce.close()
    assert ca.call(gen("a1"))["event"] == "done"  # others stay
    ca.close()
    st, _, body = complete(d, eve)
    assert_error(st, body, 401, "unauthorized", "eve after reload")
    st, _, body = complete(d, alice)
    assert_ok(st, body, "alice after reload")
    d.rewrite(MAIN_ENTRIES)  # eve is back: a new connection works again
    d.signal(signal.SIGHUP)
    deadline = time.time() + gsd.scaled(10)
    while complete(d, eve)[0] != 200:
        assert time.time() < deadline, "eve's key did not come back"
        time.sleep(0.1)


def test_backoff_keyed_by_forwarded_address_from_trusted_proxy():
    entries = [key_entry("alice", PROXY_KEYS["alice"]["hash"], ["*"])]
    d = AuthDaemon(entries, auth_more="max_failures: 3\nbackoff: 30s\ntrusted_proxies: [\"127.0.0.1\"]")
    try:
        alice = PROXY_KEYS["alice"]["key"]
        bad = {"X-Forwarded-For": "203.0.113.9, 10.0.0.1"}
        for i in range(3):
            st, _, body = complete(d, "gsk_wrong%d" % i, headers=bad)
            assert_error(st, body, 401, "unauthorized", "wrong key %d" % i)
        st, hd, body = complete(d, alice, headers=bad)  # backing off: even a good key waits
        assert_error(st, body, 429, "rate_limited", "backing off")
        assert 1 <= int(hd["retry-after"]) <= 30, hd
        st, _, body = complete(d, alice, headers={"X-Forwarded-For": "10.0.0.2"})
        assert_ok(st, body, "another forwarded address")
        st, _, body = complete(d, alice)  # the proxy's own address is not 10.0.0.1
        assert_ok(st, body, "no X-Forwarded-For")
        # a proxy appends its own X-Forwarded-For line after the client's: the last one counts
        c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=gsd.scaled(30))
        c.putrequest("POST", "/v1/completions")
        body = json.dumps({"model": "m0", "prompt": "hi", "max_tokens": 2}).encode()
        for k, v in (("Authorization", "Bearer " + alice), ("X-Forwarded-For", "10.0.0.3"),
                     ("X-Forwarded-For", "10.0.0.1"), ("Content-Type", "application/json"),
                     ("Content-Length", str(len(body)))):
            c.putheader(k, v)
        c.endheaders(body)
        r = c.getresponse()
        assert r.status == 429, (r.status, r.read())
        c.close()
        rep = d.stats()["auth"]
        assert rep["listeners"]["http"]["total_auth_invalid"] == 3, rep
        assert rep["listeners"]["http"]["total_auth_backoff"] == 2 and rep["curr_backoff_addresses"] == 1, rep
    finally:
        check_no_key_material(d)
        assert d.stop() == 0


def test_backoff_ignores_forwarded_for_from_untrusted_peer():
    entries = [key_entry("alice", PROXY_KEYS["alice"]["hash"], ["*"])]
    d = AuthDaemon(entries, auth_more="max_failures: 2\nbackoff: 30s")
    try:
        alice = PROXY_KEYS["alice"]["key"]
        for i in range(2):  # spoofed addresses: all counted against 127.0.0.1
            st, _, body = complete(d, "gsk_bad", headers={"X-Forwarded-For": "10.9.9.%d" % i})
            assert st == 401, body
        st, _, body = complete(d, alice, headers={"X-Forwarded-For": "10.9.9.99"})
        assert_error(st, body, 429, "rate_limited", "untrusted X-Forwarded-For")
        c = Tcp(d.tcp_port)  # the back-off is per address, whatever the listener
        ans = c.auth(alice)
        assert ans["error"]["code"] == "rate_limited", ans
        c.close()
    finally:
        check_no_key_material(d)
        assert d.stop() == 0


def test_usage_per_key_in_stats_and_metrics():
    d = daemon()
    alice = KEYS["alice"]["key"]
    before = d.stats()["auth"]["keys"]["alice"]
    st, _, body = complete(d, alice, n=5)
    assert_ok(st, body, "alice")
    used = body["usage"]["total_tokens"]
    rep = d.stats()["auth"]
    k = rep["keys"]["alice"]
    assert k["total_requests"] == before["total_requests"] + 1, (before, k)
    assert k["total_tokens"] == before["total_tokens"] + used and k["curr_inflight"] == 0, (before, k, used)
    assert rep["keys"]["carol"]["rejected_rate"] >= 1 and rep["keys"]["dave"]["rejected_concurrency"] >= 1, rep
    assert rep["listeners"]["http"]["required"] and not rep["listeners"]["unix"]["required"], rep
    assert rep["listeners"]["http"]["total_auth_missing"] >= 1 and rep["listeners"]["tcp"]["total_auth_invalid"] >= 1
    # metrics.listen needs no key; its text carries per-key series by name
    st, _, text = request(d.mport, "GET", "/metrics")
    assert st == 200, text
    assert re.search(r'^gpuswapd_key_requests_total\{key="alice"\} [1-9]', text, re.M), text[-2000:]
    assert re.search(r'^gpuswapd_key_rejections_total\{key="carol",cause="rate"\} [1-9]', text, re.M)
    assert re.search(r'^gpuswapd_auth_attempts_total\{listener="http",result="invalid"\} [1-9]', text, re.M)
    assert re.search(r'^gpuswapd_total_errors_unauthorized [1-9]', text, re.M) or "unauthorized" in text
    promtool = shutil.which("promtool")
    if promtool:
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0 or "lint" in out.stdout + out.stderr, out.stdout + out.stderr
    # /metrics on listen.http with a key for every model works too; it names every model, so
    # a key limited to some gets the answer of an unknown path
    st, _, text2 = request(d.port, "GET", "/metrics", key=alice)
    assert st == 200 and "gpuswapd_key_tokens_total" in text2
    st, _, body = request(d.port, "GET", "/metrics", key=KEYS["bob"]["key"])
    st2, _, body2 = request(d.port, "GET", "/nosuch", key=KEYS["bob"]["key"])
    assert st == st2 == 404 and body["error"]["code"] == body2["error"]["code"], (body, body2)


def test_cli_api_key():
    d = daemon()
    env = dict(os.environ, GPUSWAP_SOCKET="127.0.0.1:%d" % d.tcp_port, GPUSWAP_ADMIN_SOCKET=d.admin)
    env.pop("GPUSWAP_API_KEY", None)
    out = subprocess.run([GPUSWAP, "models"], env=env, capture_output=True, text=True, timeout=gsd.scaled(30))
    assert out.returncode == 1 and "unauthorized" in out.stderr, (out.returncode, out.stderr)
    out = subprocess.run([GPUSWAP, "--api-key", KEYS["bob"]["key"], "models", "--json"], env=env,
                         capture_output=True, text=True, timeout=gsd.scaled(30))
    assert out.returncode == 0, out.stderr
    assert [m["name"] for m in json.loads(out.stdout)["models"]] == ["m0"], out.stdout
    env["GPUSWAP_API_KEY"] = KEYS["alice"]["key"]
    out = subprocess.run([GPUSWAP, "generate", "-m", "m1", "-n", "3", "--temp", "0", "--json", "Once"], env=env,
                         capture_output=True, text=True, timeout=gsd.scaled(30))
    assert out.returncode == 0 and json.loads(out.stdout)["event"] == "done", (out.stdout, out.stderr)
    out = subprocess.run([GPUSWAP, "--api-key", "gsk_nope", "models"], env=env, capture_output=True, text=True,
                         timeout=gsd.scaled(30))
    assert out.returncode == 1 and "unauthorized" in out.stderr, out.stderr
    out = subprocess.run([GPUSWAP, "stats"], env=env, capture_output=True, text=True, timeout=gsd.scaled(30))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^API KEY +REQUESTS +TOKENS", out.stdout, re.M), out.stdout
    assert re.search(r"^alice +[1-9]\d* +[1-9]\d* +\d+/\d+/\d+ +0$", out.stdout, re.M), out.stdout
    assert re.search(r"^auth on http: \d+ ok, [1-9]\d* without a key, [1-9]\d* wrong keys", out.stdout, re.M), out.stdout


def test_python_client_api_key():
    sys.path.insert(0, os.path.join(gsd.ROOT, "clients", "python"))
    import gpuswap  # noqa: E402
    d = daemon()
    addr = "127.0.0.1:%d" % d.tcp_port
    c = gpuswap.Client(socket_path=addr, api_key=KEYS["bob"]["key"])
    try:
        assert [m["name"] for m in c.models()] == ["m0"]
    finally:
        c.close()
    os.environ["GPUSWAP_API_KEY"] = KEYS["alice"]["key"]
    try:
        c = gpuswap.Client(socket_path=addr)
        assert sorted(m["name"] for m in c.models()) == ["m0", "m1", "slow"]
        c.close()
    finally:
        del os.environ["GPUSWAP_API_KEY"]
    c = gpuswap.Client(socket_path=addr, api_key="gsk_nope")
    try:
        c.models()
        raise AssertionError("a wrong key was accepted")
    except gpuswap.GpuswapError as e:
        assert e.code == "unauthorized", e
    finally:
        c.close()


def test_openai_node_sdk():
    node = shutil.which("node")
    if not node:
        print("  skip: node not installed", flush=True)
        return
    sdk = os.path.join(NODE_DIR, "node_modules", "openai")
    assert os.path.isdir(sdk), "the openai npm package is missing: run `make deps` (it installs tests/node)"
    d = daemon()
    script = os.path.join(NODE_DIR, "openai_auth.mjs")
    out = subprocess.run([node, script, "http://127.0.0.1:%d/v1" % d.port, KEYS["alice"]["key"]],
                         capture_output=True, text=True, timeout=gsd.scaled(120), cwd=NODE_DIR)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["with_key"]["models"] and "m0" in res["with_key"]["models"], res
    assert res["with_key"]["finish_reason"] in ("length", "stop") and res["with_key"]["text"], res
    assert res["without_key"] == {"error": "AuthenticationError", "status": 401}, res
    assert res["wrong_key"] == {"error": "AuthenticationError", "status": 401}, res
    print("  openai node sdk %s" % res.get("version"), flush=True)


def check_no_key_material(d):
    """No drawn key (nor its random part, nor a stored hash) in the daemon's log, stats or metrics."""
    texts = [d.logtext(), json.dumps(d.stats())]
    st, _, m = request(d.mport, "GET", "/metrics")
    texts.append(m if isinstance(m, str) else json.dumps(m))
    blob = "\n".join(texts)
    for k in SECRETS:
        assert k not in blob and k[4:] not in blob and k[4:20] not in blob, "key material in logs or metrics"
    for k in list(KEYS.values()) + list(PROXY_KEYS.values()):
        assert k["hash"][7:] not in blob, "a key hash in logs or metrics"


def test_no_key_material_in_logs_or_metrics():
    d = daemon()
    check_no_key_material(d)


def main():
    r = gsd.Runner()
    for t in (test_no_key_is_401_and_unauthorized, test_wrong_key_is_401_and_unauthorized,
              test_a_nul_byte_after_a_valid_key_in_the_authorization_header_is_refused,
              test_a_tcp_request_without_a_key_counts_as_missing,
              test_a_tcp_key_holding_a_nul_is_unauthorized_with_the_request_id,
              test_key_limited_to_one_model_sees_others_as_unknown,
              test_rate_limited_key_bursting_gets_429_while_another_key_does_not,
              test_concurrent_limit_overflow_gets_429_while_another_key_does_not,
              test_tokens_per_minute_refuse_once_the_budget_is_spent,
              test_revoked_key_after_reload_closes_its_connection,
              test_backoff_keyed_by_forwarded_address_from_trusted_proxy,
              test_backoff_ignores_forwarded_for_from_untrusted_peer,
              test_usage_per_key_in_stats_and_metrics, test_cli_api_key, test_python_client_api_key,
              test_openai_node_sdk, test_no_key_material_in_logs_or_metrics):
        r.run(t)
    if D is not None:
        try:
            check_no_key_material(D)
        finally:
            rc = D.stop()
            if rc != 0:
                print("FAIL daemon exit %d" % rc)
                r.failed += 1
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
