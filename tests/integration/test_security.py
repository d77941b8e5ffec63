"""Security limits of the real daemon (sim backend) over its real sockets: socket modes, admin peer credentials, model names never paths, and every request limit (line, depth, prompt tokens, max_tokens, connections, queues)."""
import ctypes
import json
import os
import select
import socket
import stat
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-sec-models-")
os.chmod(TMP, 0o755)  # the unprivileged child below needs nothing here, the daemon does
SHAPE = "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 320"
M_PATH = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE + " --seed 1")
# a valid model file that no config names: a request naming it must not load it
BAIT = gsd.mkmodel(os.path.join(TMP, "bait.gguf"), SHAPE + " --seed 2")
MODEL = [("m", M_PATH, "")]
NOBODY = 65534
OTHER_GID = 4242  # a group nobody is not in
# timeouts stretch with gsd's factor (GPUSWAPD_VALGRIND) where gsd has one
scaled = getattr(gsd, "scaled", lambda seconds: seconds)


class SecDaemon(gsd.Daemon):
    """gsd.Daemon with extra listen/admin keys, optionally HTTP and TCP listeners on free
    loopback ports; rewrite() changes the admin keys for a reload."""

    def __init__(self, models, listen="", admin="", http=False, tcp=False, tmp=None, **kw):
        self.listen_extra = listen
        self.admin_extra = admin
        self.port = gsd.free_port() if http else None
        self.tcp_port = gsd.free_port() if tcp else None
        self.kw = kw
        if tmp is None:
            tmp = gsd.tmpdir(prefix="gsd-sec-")
        super().__init__(models, tmp=tmp, **kw)
        for port in (self.port, self.tcp_port):
            if port:
                self.wait_port(port)

    def wait_port(self, port):
        deadline = time.time() + scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("no listener on %d:\n%s" % (port, self.logtext()))
                time.sleep(0.02)

    def write_config(self, models, *a, **kw):
        super().write_config(models, *a, **kw)
        with open(self.config) as f:
            text = f.read()
        lines = self.listen_extra.strip().splitlines()
        if self.port:
            lines.append("http: 127.0.0.1:%d" % self.port)
        if self.tcp_port:
            lines.append("tcp: 127.0.0.1:%d" % self.tcp_port)
        for sock, extra in ((self.sock, lines), (self.admin, self.admin_extra.strip().splitlines())):
            key = "  socket: %s\n" % sock
            text = text.replace(key, key + "".join("  %s\n" % l for l in extra), 1)
        with open(self.config, "w") as f:
            f.write(text)

    def rewrite(self, admin):
        self.admin_extra = admin
        self.write_config(self.models, **self.kw)

    def reload(self):
        ans = self.admin_call({"op": "reload", "id": "reload"})
        assert ans.get("ok"), ans
        return ans


def error_code(ev):
    return ev.get("error", {}).get("code") if ev.get("event") == "error" else None


def closed(c, timeout=10):
    """True when the server closes c (EOF or reset) within timeout, False if a line comes."""
    c.sock.settimeout(scaled(timeout))
    try:
        c.recv()
        return False
    except (EOFError, ConnectionResetError, BrokenPipeError):
        return True


# ------------------------------------------------------------------ HTTP over raw sockets

def http_send(port, method, path, body=None, raw=None, keep_alive=True):
    s = socket.create_connection(("127.0.0.1", port), scaled(10))
    http_write(s, method, path, body, raw, keep_alive)
    return s


def http_write(s, method, path, body=None, raw=None, keep_alive=True):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    head = "%s %s HTTP/1.1\r\nHost: x\r\nConnection: %s\r\n" % (
        method, path, "keep-alive" if keep_alive else "close")
    if data or method == "POST":
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(data)
    s.sendall(head.encode() + b"\r\n" + data)


def http_read(s, timeout=30):
    """One response with a Content-Length: (status, lower-cased headers dict, body bytes)."""
    s.settimeout(scaled(timeout))
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError("closed before a response: %r" % buf[-200:])
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split(" ", 2)[1]), hdrs, body


def http_call(port, method, path, body=None, raw=None):
    s = http_send(port, method, path, body, raw, keep_alive=False)
    try:
        return http_read(s)
    finally:
        s.close()


def openai_error(status, body, want_status, want_code):
    assert status == want_status, (status, body)
    err = json.loads(body)["error"]
    assert err["code"] == want_code, err
    assert err["message"] and "param" in err, err
    assert err["type"] in ("invalid_request_error", "rate_limit_error", "server_error"), err
    return err


def socket_closed(s, timeout=10):
    s.settimeout(scaled(timeout))
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


# ------------------------------------------------------------------ another uid

def as_user(uid, gid, fn, *args, groups=()):
    """Runs fn(*args) in a forked child that has dropped to uid:gid (with the supplementary
    groups given) and returns its (JSON) result; the child's exception becomes an AssertionError."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            out = {"ok": fn(*args)}
        except BaseException as e:  # report everything to the parent
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        with os.fdopen(w, "w") as f:
            json.dump(out, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    res = json.loads(data or '{"error": "child died"}')
    if "error" in res:
        raise AssertionError("as %d:%d: %s" % (uid, gid, res["error"]))
    return res["ok"]


def refused_exchange(path, req):
    """Child side: what one admin connection carrying req got, and how it ended."""
    c = gsd.Client(path, timeout=10)
    lines, end = [], None
    try:
        try:
            c.send(req)
        except BrokenPipeError:  # already closed after the forbidden line: still readable
            pass
        while len(lines) < 4:
            lines.append(c.recv())
    except EOFError:
        end = "eof"
    except ConnectionResetError:
        end = "reset"
    except socket.timeout:
        end = "open"
    c.close()
    return {"lines": lines, "end": end, "uid": os.getuid(), "gid": os.getgid()}


def allowed_calls(path, reqs):
    c = gsd.Client(path, timeout=10)
    try:
        return [c.call(r) for r in reqs]
    finally:
        c.close()


def infer_call(path, req):
    c = gsd.Client(path, timeout=30)
    try:
        return c.call(req)
    finally:
        c.close()


ADMIN_OPS = [{"op": "stats"}, {"op": "models"}, {"op": "load", "model": "m"},
             {"op": "evict", "model": "m"}, {"op": "pin", "model": "m"},
             {"op": "unpin", "model": "m"}, {"op": "reload"}, {"op": "drain"}]


# ------------------------------------------------------------------ (a) socket modes

def test_socket_files_have_the_configured_modes():
    d = SecDaemon(MODEL, listen='mode: "0620"', admin='mode: "0640"')
    try:
        d.stats()  # serving (the sockets exist a moment before SIGTERM drains)
        for path, want in ((d.sock, 0o620), (d.admin, 0o640)):
            st = os.lstat(path)
            assert stat.S_ISSOCK(st.st_mode), (path, oct(st.st_mode))
            assert stat.S_IMODE(st.st_mode) == want, (path, oct(st.st_mode))
            assert st.st_uid == os.geteuid(), (path, st.st_uid)
    finally:
        assert d.stop() == 0
    d = SecDaemon(MODEL)  # the defaults: 0660 and 0600
    try:
        d.stats()
        for path, want in ((d.sock, 0o660), (d.admin, 0o600)):
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            assert mode == want, (path, oct(mode))
    finally:
        assert d.stop() == 0


# ------------------------------------------------------------------ (b) peer credentials

def test_admin_refuses_a_uid_not_allowed_for_every_op_and_admits_listed_uids_and_gids():
    if os.geteuid() != 0:
        print("   skip: needs root to connect as another uid")
        return
    tmp = gsd.tmpdir(prefix="gsd-sec-peer-")
    os.chmod(tmp, 0o755)  # reachable by nobody; the socket modes let it connect
    d = SecDaemon(MODEL, listen='mode: "0666"', admin='mode: "0666"', tmp=tmp)
    try:
        # a reload the refused peer asks for must not happen: the file now adds a model
        d.models = MODEL + [("m2", M_PATH, "")]
        d.rewrite('mode: "0666"')
        for op in ADMIN_OPS + [{"op": "no-such-op"}]:
            req = dict(op, id="x")
            got = as_user(NOBODY, NOBODY, refused_exchange, d.admin, req)
            assert (got["uid"], got["gid"]) == (NOBODY, NOBODY), got
            assert len(got["lines"]) == 1, (op, got)
            ev = got["lines"][0]
            assert error_code(ev) == "forbidden" and ev["ok"] is False and ev["id"] is None, (op, ev)
            assert got["end"] in ("eof", "reset"), (op, got)
        # none of it happened: not loaded, not pinned, not reloaded, not drained
        assert d.proc.poll() is None, "a refused drain stopped the daemon"
        models = d.admin_call({"op": "models", "id": "m"})["models"]
        assert [m["name"] for m in models] == ["m"], models
        assert models[0]["pinned"] is False and models[0]["curr_resident_bytes"] == 0, models
        st = d.stats()["server"]
        assert st["total_errors_forbidden"] == len(ADMIN_OPS) + 1, st
        # the inference socket is not the admin socket: its mode alone decides
        ev = as_user(NOBODY, NOBODY, infer_call, d.sock,
                     {"op": "generate", "id": 1, "model": "m", "prompt": "hi", "max_tokens": 2})
        assert ev["event"] == "done", ev

        # admin.uids lets that uid in (a reload applies it)
        d.models = MODEL
        d.rewrite('mode: "0666"\nuids: [%d]' % NOBODY)
        d.reload()
        ans = as_user(NOBODY, NOBODY, allowed_calls, d.admin,
                      [{"op": "stats", "id": 1}, {"op": "pin", "id": 2, "model": "m"},
                       {"op": "unpin", "id": 3, "model": "m"}])
        assert all(a.get("ok") for a in ans), ans
        assert ans[1]["pinned"] is True and ans[2]["pinned"] is False, ans

        # admin.gids: the peer's gid decides, for a uid not listed
        d.rewrite('mode: "0666"\nuids: []\ngids: [%d]' % OTHER_GID)
        d.reload()
        got = as_user(NOBODY, NOBODY, refused_exchange, d.admin, {"op": "stats", "id": 1})
        assert error_code(got["lines"][0]) == "forbidden", got
        ans = as_user(NOBODY, OTHER_GID, allowed_calls, d.admin, [{"op": "stats", "id": 1}])
        assert ans[0].get("ok") is True, ans
        # a supplementary group counts too (an operators' group usually is one)
        ans = as_user(NOBODY, NOBODY, allowed_calls, d.admin, [{"op": "stats", "id": 1}],
                      groups=(OTHER_GID,))
        assert ans[0].get("ok") is True, ans
    finally:
        assert d.stop() == 0


# ------------------------------------------------------------------ (c) names, never paths

class OpenWatch:
    """inotify on files: did anyone open them since start?"""
    IN_OPEN, IN_ACCESS, IN_NONBLOCK = 0x20, 0x01, 0o4000

    def __init__(self, paths):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.names = {}
        for p in paths:
            wd = self.libc.inotify_add_watch(self.fd, p.encode(), self.IN_OPEN | self.IN_ACCESS)
            assert wd >= 0, (p, os.strerror(ctypes.get_errno()))
            self.names[wd] = p

    def opened(self):
        seen = set()
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            i = 0
            while i < len(buf):
                wd, mask, _, n = struct.unpack_from("iIII", buf, i)
                seen.add(self.names.get(wd, wd))
                i += 16 + n

    def close(self):
        os.close(self.fd)


def test_clients_name_only_configured_models_and_no_field_is_a_path():
    cfg_bait = os.path.join(TMP, "bait.yaml")
    with open(cfg_bait, "w") as f:
        f.write("models: []\n")
    probe = os.path.join(TMP, "probe")
    open(probe, "w").close()
    d = SecDaemon(MODEL, http=True)
    watch = OpenWatch([BAIT, M_PATH, cfg_bait, "/etc/passwd", "/etc/shadow", probe])
    try:
        open(probe).close()  # the watch sees opens
        assert watch.opened() == {probe}
        c = d.client()
        paths = ["/etc/passwd", "../x.gguf", "./m", "m/", "m.gguf", M_PATH, BAIT,
                 os.path.relpath(BAIT), "~/m", "file://" + BAIT]
        for p in paths:
            for req in ({"op": "generate", "model": p, "prompt": "hi", "max_tokens": 1},
                        {"op": "chat", "model": p, "messages": [{"role": "user", "content": "hi"}]},
                        {"op": "tokenize", "model": p, "text": "hi"}):
                ev = c.call(dict(req, id="n"))
                assert error_code(ev) == "unknown_model", (p, req, ev)
                assert ev["id"] == "n", ev
                # the answer echoes the name asked for and may list the configured
                # models, never their files
                assert M_PATH not in ev["error"]["message"].replace(repr(p)[1:-1], ""), ev
                if req["op"] != "tokenize":
                    assert "(configured: m)" in ev["error"]["message"], ev
            for op in ("load", "evict", "pin", "unpin"):
                ans = d.admin_call({"op": op, "id": op, "model": p})
                assert error_code(ans) == "unknown_model", (p, op, ans)
            status, _, body = http_call(d.port, "POST", "/v1/completions",
                                        {"model": p, "prompt": "hi", "max_tokens": 1})
            openai_error(status, body, 404, "unknown_model")
        for p in ("%2Fetc%2Fpasswd", "..%2Fm.gguf", "m.gguf"):
            status, _, body = http_call(d.port, "GET", "/v1/models/" + p)
            openai_error(status, body, 404, "unknown_model")
        # a path where a name belongs is just a string everywhere else: prompts, text, stop
        # strings, ids; fields that would name a file do not exist
        ev = c.call({"op": "generate", "id": BAIT, "model": "m", "prompt": BAIT, "max_tokens": 2,
                     "stop": [cfg_bait]})
        assert ev["event"] == "done" and ev["id"] == BAIT, ev
        ev = c.call({"op": "tokenize", "id": "t", "model": "m", "text": "/etc/passwd"})
        assert ev["ok"] and ev["tokens"], ev
        for field in ("path", "file", "model_path", "config", "gguf", "lora", "grammar_file"):
            ev = c.call({"op": "generate", "id": "f", "model": "m", "prompt": "hi", field: BAIT})
            assert error_code(ev) == "bad_request" and field in ev["error"]["message"], (field, ev)
            for op in ({"op": "load", "model": "m"}, {"op": "reload"}):
                ans = d.admin_call(dict(op, id="f", **{field: cfg_bait}))
                assert error_code(ans) == "bad_request", (field, op, ans)
            status, _, body = http_call(d.port, "POST", "/v1/completions",
                                        {"model": "m", "prompt": "hi", field: BAIT})
            openai_error(status, body, 400, "bad_request")
        c.close()
        # nothing was opened, nothing was added
        seen = watch.opened()
        assert not seen, "the daemon opened %s" % sorted(seen)
        models = d.admin_call({"op": "models", "id": "m"})["models"]
        assert [m["name"] for m in models] == ["m"], models
        st = d.stats()["server"]
        assert st["total_errors_unknown_model"] >= len(paths) * 8, st
    finally:
        watch.close()
        assert d.stop() == 0


# ------------------------------------------------------------------ (d) limits

MAX_LINE = 3 << 20  # room for a tokens array of 1,000,001 ids
LIMIT_MODELS = [
    ("m", M_PATH, "max_context: 64\ndefaults:\n  max_tokens: 4"),
    # the default max_tokens is the whole context: it shrinks to what the prompt leaves
    ("full", M_PATH, "max_context: 64\ndefaults:\n  max_tokens: 64"),
]


def limits_daemon():
    return SecDaemon(LIMIT_MODELS, listen="max_line: %d" % MAX_LINE, http=True)


def padded(n, rid="pad"):
    """A valid models request of exactly n bytes (whitespace pads it)."""
    head, tail = '{"op":"models","id":"%s"' % rid, "}"
    line = head + " " * (n - len(head) - len(tail)) + tail
    assert len(line) == n
    return line.encode()


def test_line_limit_just_under_is_served_just_over_is_too_large_and_closes():
    d = limits_daemon()
    try:
        c = d.client()
        c.send_raw(padded(MAX_LINE, "max") + b"\n")
        ev = c.recv()
        assert ev.get("ok") and ev["id"] == "max", ev
        c.send_raw(padded(MAX_LINE - 1, "under") + b"\r\n")  # the '\r' counts: MAX_LINE bytes
        ev = c.recv()
        assert ev.get("ok") and ev["id"] == "under", ev
        c.send_raw(padded(MAX_LINE + 1, "over") + b"\n")
        ev = c.recv()
        assert error_code(ev) == "too_large" and ev["id"] is None, ev
        assert closed(c), "connection stayed open after too_large"
        # a line that never ends is cut off as soon as it passes the limit
        c = d.client()
        c.send_raw(b" " * (MAX_LINE + 1))
        ev = c.recv()
        assert error_code(ev) == "too_large", ev
        assert closed(c), "connection stayed open after too_large"
        # HTTP: a body of max_line bytes is read, one byte more is a 413 in OpenAI's shape
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        raw = json.dumps(body).encode()
        raw = raw[:-1] + b" " * (MAX_LINE - len(raw)) + b"}"
        status, _, b = http_call(d.port, "POST", "/v1/completions", raw=raw)
        assert status == 200, (status, b[:300])
        status, _, b = http_call(d.port, "POST", "/v1/completions", raw=raw[:-1] + b" }")
        openai_error(status, b, 413, "too_large")
        # and the daemon serves on
        c = d.client()
        assert c.call({"op": "generate", "id": 1, "model": "m", "prompt": "hi"})["event"] == "done"
        c.close()
        assert d.stats()["server"]["total_errors_too_large"] == 3
    finally:
        assert d.stop() == 0


def nested(levels, rid):
    """A generate request whose extra field "x" makes the whole line `levels` deep."""
    inner = "[" * (levels - 1) + "]" * (levels - 1)
    return ('{"op":"generate","id":"%s","model":"m","prompt":"hi","x":%s}' % (rid, inner)).encode()


def test_json_depth_32_is_parsed_33_is_bad_request():
    d = limits_daemon()
    try:
        for path in (d.sock, d.admin):
            c = gsd.Client(path)
            c.send_raw(nested(32, "d32") + b"\n")
            ev = c.recv()
            # parsed: the answer is about the request (its id echoed, the field named)
            assert error_code(ev) == "bad_request" and ev["id"] == "d32", ev
            assert "nested" not in ev["error"]["message"], ev
            c.send_raw(nested(33, "d33") + b"\n")
            ev = c.recv()
            assert error_code(ev) == "bad_request" and ev["id"] is None, ev
            assert "deeper than 32" in ev["error"]["message"], ev
            # brackets inside strings do not count; the connection stays usable
            c.send_raw(b'{"op":"models","id":"s","pad":"' + b"[" * 1000 + b'"}\n')
            ev = c.recv()
            assert error_code(ev) == "bad_request" and ev["id"] == "s", ev
            c.send_raw(b"[" * 200000 + b"\n")
            ev = c.recv()
            assert error_code(ev) == "bad_request" and ev["id"] is None, ev
            assert c.call({"op": "models", "id": "ok"}).get("ok"), "connection unusable"
            c.close()
        # HTTP bodies are bounded as well: a deep one is a 400, not a crash
        status, _, b = http_call(d.port, "POST", "/v1/completions", raw=b"[" * 200000)
        assert status == 400, (status, b[:200])
        status, _, b = http_call(d.port, "POST", "/v1/completions",
                                 raw=b'{"model":"m","prompt":' + b"[" * 40 + b"1" + b"]" * 40 + b"}")
        assert status == 400, (status, b[:200])
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


def test_prompt_tokens_over_the_context_and_over_1000000_ids():
    d = limits_daemon()
    try:
        c = d.client()
        gen = {"op": "generate", "model": "m", "max_tokens": 1, "temperature": 0}
        ev = c.call(dict(gen, id="long", prompt="once upon a time " * 40))
        assert error_code(ev) == "context_overflow", ev
        ev = c.call(dict(gen, id="t64", tokens=[5] * 64))  # prompt_tokens == context
        assert error_code(ev) == "context_overflow", ev
        ev = c.call(dict(gen, id="t63", tokens=[5] * 63))  # fits, with one to generate
        assert ev["event"] == "done" and ev["usage"]["prompt_tokens"] == 63, ev
        # the codec takes up to 1,000,000 ids (then the context decides), not one more
        ev = c.call(dict(gen, id="t1m", tokens=[5] * 1000000))
        assert error_code(ev) == "context_overflow", ev
        ev = c.call(dict(gen, id="t1m1", tokens=[5] * 1000001))
        assert error_code(ev) == "bad_request" and "1000000" in ev["error"]["message"], ev
        ev = c.call(dict(gen, id="vocab", tokens=[320]))
        assert error_code(ev) == "bad_request" and "vocabulary" in ev["error"]["message"], ev
        ev = c.call(dict(gen, id="neg", tokens=[-1]))
        assert error_code(ev) == "bad_request", ev
        status, _, b = http_call(d.port, "POST", "/v1/completions",
                                 {"model": "m", "prompt": "once upon a time " * 40})
        openai_error(status, b, 400, "context_overflow")
        c.close()
    finally:
        assert d.stop() == 0


def test_max_tokens_range_context_and_configured_default():
    d = limits_daemon()
    try:
        c = d.client()
        gen = {"op": "generate", "model": "m", "prompt": "hi", "temperature": 0}
        for bad in (-1, 2 ** 31, 1.5, "8", True, None):
            ev = c.call(dict(gen, id="b", max_tokens=bad))
            assert error_code(ev) == "bad_request" and "max_tokens" in ev["error"]["message"], (bad, ev)
        ev = c.call(dict(gen, id="big", max_tokens=2 ** 31 - 1))  # in range, but no context fits it
        assert error_code(ev) == "context_overflow", ev
        n = c.call({"op": "tokenize", "id": "n", "model": "m", "text": "hi"})["tokens"]
        ev = c.call(dict(gen, id="over", max_tokens=64 - len(n) + 1))
        assert error_code(ev) == "context_overflow", ev
        # the configured default (4) is a default, not a cap
        ev = c.call(dict(gen, id="above", max_tokens=20))
        assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 20, ev
        ev = c.call(dict(gen, id="dflt"))
        assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 4, ev
        ev = c.call(dict(gen, id="zero", max_tokens=0))  # nothing to generate: done at once
        assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 0 and ev["text"] == "", ev
        assert ev["finish_reason"] == "length", ev
        ev = c.call(dict(gen, id="exact", max_tokens=64 - len(n)))
        assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 64 - len(n), ev
        # a default larger than what the prompt leaves shrinks to fit
        ev = c.call(dict(gen, id="shrink", model="full"))
        assert ev["event"] == "done" and ev["finish_reason"] == "length", ev
        assert ev["usage"]["completion_tokens"] == 64 - len(n), ev
        for bad in (-1, 2 ** 31, "8"):
            status, _, b = http_call(d.port, "POST", "/v1/completions",
                                     {"model": "m", "prompt": "hi", "max_tokens": bad})
            openai_error(status, b, 400, "bad_request")
        c.close()
    finally:
        assert d.stop() == 0


def wait_until(fn, timeout=10):
    deadline = time.time() + scaled(timeout)
    while True:
        v = fn()
        if v or time.time() > deadline:
            return v
        time.sleep(0.05)


def tcp_client(port):
    """gsd.Client's reading on a TCP socket."""
    c = gsd.Client.__new__(gsd.Client)
    c.sock = socket.create_connection(("127.0.0.1", port), 10)
    c.sock.settimeout(scaled(30))
    c.buf = b""
    return c


def try_client(make):
    """A served inference connection from make(), or None when it is refused."""
    try:
        c = make()
        ev = c.call({"op": "models", "id": "probe"})
        if ev.get("ok"):
            return c
        c.close()
    except (EOFError, ConnectionResetError, BrokenPipeError):
        pass
    return None


def test_connection_limit_counts_unix_and_tcp_refuses_the_next_and_frees_on_close():
    d = SecDaemon(MODEL, listen="max_connections: 3", tcp=True)
    try:
        # a connection just closed (the start-up probe of the TCP port) counts until the
        # daemon has seen it go: retry until served
        tcp = lambda: tcp_client(d.tcp_port)  # noqa: E731
        held = [wait_until(lambda: try_client(make)) for make in (d.client, d.client, tcp)]
        assert all(held), held
        before = d.stats()["server"]["total_errors_overloaded"]
        for make in (d.client, tcp):
            c = make()
            ev = c.recv()
            assert error_code(ev) == "overloaded" and ev["id"] is None, ev
            assert "connections" in ev["error"]["message"], ev
            assert closed(c), "the connection over the limit stayed open"
            c.close()
        # the admin socket is not refused at the limit, and its connections take no client slot
        admins = [gsd.Client(d.admin) for _ in range(3)]
        st = admins[0].call({"op": "stats", "id": "s"})["server"]
        assert st["total_errors_overloaded"] == before + 2, st
        # the ones inside the limit were not disturbed
        for i, c in enumerate(held):
            assert c.call({"op": "generate", "id": i, "model": "m", "prompt": "hi",
                           "max_tokens": 2})["event"] == "done"
        held.pop(0).close()
        c = wait_until(lambda: try_client(d.client))
        assert c, "no new connection accepted after one closed"
        held.append(c)
        assert c.call({"op": "generate", "id": "new", "model": "m", "prompt": "hi",
                       "max_tokens": 2})["event"] == "done"
        for c in held + admins:
            c.close()
    finally:
        assert d.stop() == 0


def http_health(s):
    http_write(s, "GET", "/health")
    return http_read(s)


def http_fresh(port):
    """A new keep-alive HTTP connection whose first request was served, or None."""
    s = socket.create_connection(("127.0.0.1", port), 10)
    try:
        if http_health(s)[0] == 200:
            return s
    except (EOFError, ConnectionResetError):
        pass
    s.close()
    return None


def test_http_connection_limit_503_in_openai_shape_then_serves_again():
    d = SecDaemon(MODEL, listen="max_connections: 3", http=True)
    try:
        # keep-alive connections, each with a request answered (retried while the
        # start-up probe of the port still counts)
        held = [wait_until(lambda: http_fresh(d.port)) for _ in range(3)]
        assert all(held), held
        # over the limit: the request is answered 503 (OpenAI's shape) and the connection closes
        for method, path, body in (("GET", "/health", None),
                                   ("POST", "/v1/completions", {"model": "m", "prompt": "hi"})):
            s = http_send(d.port, method, path, body)
            status, hdrs, b = http_read(s)
            err = openai_error(status, b, 503, "overloaded")
            assert "max_connections" in err["message"], err
            assert hdrs.get("connection", "").lower() == "close", hdrs
            assert hdrs.get("retry-after") == "1", hdrs
            assert socket_closed(s), "the refused connection stayed open"
            s.close()
        # one that sends nothing is not kept: closed after a short timeout
        t0 = time.time()
        s = socket.create_connection(("127.0.0.1", d.port), 10)
        assert socket_closed(s, scaled(15)), "an idle refused connection stayed open"
        waited = time.time() - t0
        assert waited < scaled(10), waited
        s.close()
        # a flood over the limit is cut off at once beyond a bound (64 waiting)
        flood = [socket.create_connection(("127.0.0.1", d.port), 10) for _ in range(80)]
        cut, deadline = set(), time.time() + scaled(4)  # well before their 5 s timeout
        while len(cut) < 80 - 64 and time.time() < deadline:
            ready, _, _ = select.select([s for s in flood if s not in cut], [], [], 0.1)
            cut.update(s for s in ready if socket_closed(s, 1))
        assert len(cut) >= 80 - 64, len(cut)
        for s in flood:
            s.close()
        # the held connections still work, and the other sockets too
        for s in held:
            got = http_health(s)
            assert got[0] == 200, got
        c = d.client()
        assert c.call({"op": "generate", "id": 1, "model": "m", "prompt": "hi",
                       "max_tokens": 2})["event"] == "done"
        c.close()
        # once one closes, a new connection is served
        held.pop().close()
        s = wait_until(lambda: http_fresh(d.port))
        assert s, "no new HTTP connection served after one closed"
        held.append(s)
        for s in held:
            s.close()
        assert d.stats()["server"]["total_errors_overloaded"] >= 2
    finally:
        assert d.stop() == 0


def queued(d, name):
    for m in d.admin_call({"op": "models", "id": "q"})["models"]:
        if m["name"] == name:
            return m["curr_queued"], m["curr_running"]
    raise AssertionError(name)


def test_queue_limit_per_model_and_max_queued_overall_answer_overloaded():
    # about 8 ms a token with one thread (as in test_http.py): a request of 1000 tokens
    # runs for seconds; greedy on "hello world" meets no end-of-sequence before
    big = os.path.join(TMP, "big.gguf")
    if not os.path.exists(big):
        gsd.mkmodel(big, "--type f16 --dim 512 --layers 8 --heads 8 --kv-heads 4 --ff 1536 "
                    "--vocab 400 --seed 7")
    # max_batch 1: one request runs per model, the next ones wait in its queue
    models = [("a", big, "max_batch: 1"), ("b", big, "max_batch: 1")]
    d = SecDaemon(models, memory="256MiB", http=True,
                  scheduler="queue_limit: 2\nmax_queued: 3\nmax_wait: 1m")
    try:
        c = d.client()
        long = {"op": "generate", "prompt": "hello world", "max_tokens": 1000, "temperature": 0}
        c.send(dict(long, id="run-a", model="a"))
        assert wait_until(lambda: queued(d, "a") == (0, 1)), queued(d, "a")
        c.send(dict(long, id="a1", model="a"))
        c.send(dict(long, id="a2", model="a"))
        assert wait_until(lambda: queued(d, "a") == (2, 1)), queued(d, "a")
        c.send(dict(long, id="a3", model="a"))
        ev = c.recv()
        assert ev["id"] == "a3" and error_code(ev) == "overloaded", ev
        assert "limit 2" in ev["error"]["message"], ev
        # HTTP meets the same queue: 503 in OpenAI's shape
        status, hdrs, b = http_call(d.port, "POST", "/v1/completions",
                                    {"model": "a", "prompt": "hi", "max_tokens": 1})
        openai_error(status, b, 503, "overloaded")
        # b runs one and queues one: three queued in all, so b's second is refused
        # although b's own queue has room
        c.send(dict(long, id="run-b", model="b"))
        assert wait_until(lambda: queued(d, "b") == (0, 1)), queued(d, "b")
        c.send(dict(long, id="b1", model="b"))
        assert wait_until(lambda: queued(d, "b") == (1, 1)), queued(d, "b")
        c.send(dict(long, id="b2", model="b"))
        ev = c.recv()
        assert ev["id"] == "b2" and error_code(ev) == "overloaded", ev
        assert "3 in all" in ev["error"]["message"], ev
        st = d.stats()["server"]
        assert st["total_errors_overloaded"] == 3, st
        # closing the connection cancels the rest; the queues empty and serve again
        c.close()
        assert wait_until(lambda: queued(d, "a") == (0, 0) and queued(d, "b") == (0, 0))
        c = d.client()
        assert c.call({"op": "generate", "id": 1, "model": "a", "prompt": "hi",
                       "max_tokens": 2})["event"] == "done"
        c.close()
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_socket_files_have_the_configured_modes,
               test_admin_refuses_a_uid_not_allowed_for_every_op_and_admits_listed_uids_and_gids,
               test_clients_name_only_configured_models_and_no_field_is_a_path,
               test_line_limit_just_under_is_served_just_over_is_too_large_and_closes,
               test_json_depth_32_is_parsed_33_is_bad_request,
               test_prompt_tokens_over_the_context_and_over_1000000_ids,
               test_max_tokens_range_context_and_configured_default,
               test_connection_limit_counts_unix_and_tcp_refuses_the_next_and_frees_on_close,
               test_http_connection_limit_503_in_openai_shape_then_serves_again,
               test_queue_limit_per_model_and_max_queued_overall_answer_overloaded]:
        r.run(fn)
    sys.exit(r.exit_code())
