"""Load: 64 concurrent clients send thousands of mixed requests to 8 models on a sim pool that holds two; every request gets one final line, greedy output equals its reference, cancels and disconnects clean up, and fds, memory and stats come back to where they were."""
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-load-models-")
SHAPE = "--dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
N_MODELS = 8
# llama f16 and qwen2 bf16 alternately: two tokenizers, two chat templates
MODELS = [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i),
                                  ("--arch llama --type f16 " if i % 2 == 0 else "--arch qwen2 --type bf16 ")
                                  + SHAPE + " --seed %d" % (i + 31)), "")
          for i in range(N_MODELS)]
NAMES = [n for n, _, _ in MODELS]
PAGE = 64 * 1024
HOST_KV = 256 * 1024  # the host KV tier's budget: a few conversations' worth


def pages(nbytes):
    return (nbytes + PAGE - 1) // PAGE


# The pool, sized from the model files: two models (each a few pages more than
# its file, for the per-segment rounding) plus KV room that is less than a third
# model, so two fit at a time and every switch evicts. Checked against the
# daemon's weight_bytes once it runs.
MODEL_PAGES = pages(max(os.path.getsize(p) for _, p, _ in MODELS)) + 2
POOL_PAGES = 3 * MODEL_PAGES - 4
POOL = "%dKiB" % (POOL_PAGES * PAGE // 1024)

N_CLIENTS = 64
# requests (generate, chat, bad lines, cancel targets, disconnects) over all clients.
# Memcheck runs a token ~300x slower: it gets a smaller run of the same mix (and fewer
# references), where shorter cancel targets are still caught mid-generation.
N_REQUESTS = int(os.environ.get("GPUSWAPD_LOAD_REQUESTS") or (128 if gsd.VALGRIND else 4000))
MAX_TOKENS = 4 if gsd.VALGRIND else 8
# RSS is not a leak measure where freed memory is held back on purpose: memcheck, and ASan's
# quarantine (up to 256 MiB); leaks are checked there by memcheck and LeakSanitizer instead
RSS_UNCHECKED = "valgrind" if gsd.VALGRIND else "ASan" if "ASAN_OPTIONS" in os.environ else ""
LONG_TOKENS = 60 if gsd.VALGRIND else 200  # cancel and disconnect targets
PROMPTS = ["Once upon a time", "The cat", "Lily went to the park", "hello world",
           "In a small village there lived", "Tom and Sue"][:3 if gsd.VALGRIND else 6]
CHATS = [[{"role": "user", "content": "hello"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "how are you"}],
         [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
          {"role": "user", "content": "tell me a story"}]]
SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 1234}
CODES = {"bad_json", "bad_request", "unknown_model", "too_large", "overloaded", "context_overflow",
         "cancelled", "shutting_down", "internal", "forbidden"}
# RSS may grow by at most this over the baseline taken after warm-up (both rounds
# there, sequential and 64-way concurrent, have set the heap's high-water mark):
# the sim pool is a memfd whose pages count in RSS once touched and warm-up need
# not have touched all of them (at most the pool), plus 4 MiB for malloc
# fragmentation. A leak of 2 KiB per request (~4.5 MiB) stays within it only
# barely; valgrind's leak check (make test-valgrind) is the precise tool.
RSS_TOLERANCE_KIB = POOL_PAGES * PAGE // 1024 + 4096


# ------------------------------------------------------------------ requests

def body(kind, model, pi, stream):
    """The request fields of one kind of generating request (no op, no id)."""
    if kind == "chat":
        r = {"op": "chat", "model": model, "messages": CHATS[pi % len(CHATS)]}
    else:
        r = {"op": "generate", "model": model, "prompt": PROMPTS[pi % len(PROMPTS)]}
    r["max_tokens"] = LONG_TOKENS if kind == "long" else MAX_TOKENS
    if kind == "seeded":
        r.update(SAMPLING)
    else:
        r["temperature"] = 0
    r["stream"] = stream
    return r


def ref_key(kind, model, pi):
    return (kind, model, pi % (len(CHATS) if kind == "chat" else len(PROMPTS)))


def cut_prefix(text, full):
    """Whether a cancelled text is a prefix of the full one. At a cancel the daemon flushes the
    bytes of a UTF-8 character it was holding back, as U+FFFD each (at most three), where the
    full run completed the character."""
    for _ in range(4):
        if full.startswith(text):
            return True
        if not text.endswith("\ufffd"):
            return False
        text = text[:-1]
    return False


def key_of(rid):
    """Ids are echoed verbatim: same JSON type, same value."""
    return (type(rid).__name__, rid)


# ------------------------------------------------------------------ one connection

class Tally:
    """What all clients did, and every problem they saw (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []

    def add(self, what, n=1):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def problem(self, msg):
        with self.lock:
            self.problems.append(msg)

    def get(self, what):
        return self.counts.get(what, 0)


class Conn:
    """One client connection with requests in flight, keyed by id; read() checks every line."""

    def __init__(self, d, refs, tally, tag):
        self.c = d.client()
        self.refs = refs
        self.t = tally
        self.tag = tag
        self.pending = {}   # key -> request record
        self.finished = set()

    def send(self, rec):
        """rec: {"id", "kind", "model", "pi", "stream", "req" (dict) or "raw" (bytes)}."""
        rec.setdefault("tokens", [])
        k = key_of(rec["id"])
        assert k not in self.pending, k
        self.pending[k] = rec
        if "raw" in rec:
            self.c.send_raw(rec["raw"])
        else:
            self.c.send(rec["req"])
        self.t.add("lines_sent")

    def read(self):
        """Reads one line and files it; returns (record, event) when it was a final line."""
        ev = self.c.recv()
        k = key_of(ev.get("id"))
        rec = self.pending.get(k)
        if rec is None:
            what = "after its final line" if k in self.finished else "for no request in flight"
            self.t.problem("%s: event %s: %r" % (self.tag, what, ev))
            return None, ev
        if ev.get("event") == "token":
            if not rec.get("stream"):
                self.t.problem("%s: token event for a request that did not stream: %r" % (self.tag, ev))
            rec["tokens"].append(ev.get("text", ""))
            return None, ev
        del self.pending[k]
        if k[1] is not None:
            self.finished.add(k)
        self.t.add("finals")
        self.check_final(rec, ev)
        return rec, ev

    def drain(self):
        """Reads until every request in flight has its final line."""
        while self.pending:
            self.read()

    def check_final(self, rec, ev):
        where = "%s %r" % (self.tag, rec["id"])
        if ev.get("event") == "error":
            code = ev.get("error", {}).get("code")
            if ev.get("ok") is not False or code not in CODES:
                self.t.problem("%s: malformed error line %r" % (where, ev))
                return
            self.t.add("error_" + code)
            want = rec.get("expect")
            if want != code and not (want is None and code == "overloaded"):
                # a valid request may be refused only as overloaded (retry later)
                self.t.problem("%s: error %s, wanted %s: %r" % (where, code, want or "done", ev))
            return
        if rec.get("expect"):
            self.t.problem("%s: wanted the error %s, got %r" % (where, rec["expect"], ev))
            return
        if rec["kind"] == "op":
            if ev.get("ok") is not True:
                self.t.problem("%s: wanted ok, got %r" % (where, ev))
            return
        if ev.get("event") != "done":
            self.t.problem("%s: wanted done, got %r" % (where, ev))
            return
        text = ev.get("text")
        if rec["stream"] and "".join(rec["tokens"]) != text:
            self.t.problem("%s: streamed texts %r do not add up to the done text %r"
                           % (where, rec["tokens"], text))
        ref = self.refs[ref_key(rec["kind"], rec["model"], rec["pi"])]
        fr = ev.get("finish_reason")
        if fr == "cancelled":
            if not rec.get("cancel"):
                self.t.problem("%s: cancelled without a cancel: %r" % (where, ev))
            elif not cut_prefix(text, ref["text"]):
                self.t.problem("%s: cancelled text %r is not a prefix of %r" % (where, text, ref["text"]))
            self.t.add("cancelled_mid_generation")
            return
        if (text, fr, ev["usage"]["completion_tokens"]) != (ref["text"], ref["finish_reason"],
                                                            ref["usage"]["completion_tokens"]):
            self.t.problem("%s: %s on %s: got %r (%s, %d tokens), reference %r (%s, %d tokens)"
                           % (where, rec["kind"], rec["model"], text, fr, ev["usage"]["completion_tokens"],
                              ref["text"], ref["finish_reason"], ref["usage"]["completion_tokens"]))
        self.t.add("matched_" + rec["kind"])

    def close_checked(self, sentinel_id):
        """A last request on this connection: anything still coming for a finished id shows up
        before its answer. Then close."""
        self.send({"id": sentinel_id, "kind": "op", "req": {"op": "models", "id": sentinel_id}})
        self.drain()
        self.c.close()

    def abandon(self):
        self.c.sock.shutdown(socket.SHUT_RDWR)
        self.c.close()


# ------------------------------------------------------------------ one client

def client(d, refs, tally, k, quota, stop_flag):
    """Client k: sessions of requests until it has sent its quota."""
    rnd = random.Random(1000 + k)
    int_ids = k % 4 == 0  # these clients use integer ids
    seq = [0]

    def new_id():
        seq[0] += 1
        return k * 1000000 + seq[0] if int_ids else "c%d-%d" % (k, seq[0])

    def pick(allow_long):
        """One request record of a random kind."""
        x = rnd.random()
        model = rnd.choice(NAMES)
        pi = rnd.randrange(12)
        rid = new_id()
        stream = rnd.random() < 0.5
        if x < 0.04:
            return {"id": None, "kind": "bad", "expect": "bad_json",
                    "raw": b'{"op":"generate","id":"x","model":\n'}
        if x < 0.07:
            return {"id": rid, "kind": "bad", "expect": "unknown_model",
                    "req": {"op": "generate", "id": rid, "model": "nope%d" % k, "prompt": "x"}}
        if x < 0.10:
            return {"id": rid, "kind": "bad", "expect": "bad_request",
                    "req": {"op": "generate", "id": rid, "model": model, "prompt": "x", "max_token": 3}}
        if allow_long and x < 0.17:
            kind = "cancel"
        elif allow_long and x < 0.22:
            kind = "disconnect"
        elif x < 0.30:
            kind = "seeded"
        elif x < 0.50:
            kind = "chat"
        else:
            kind = "gen"
        if kind in ("cancel", "disconnect"):
            pi = rnd.choice(long_prompts[model])
            req = body("long", model, pi, True)
            rec = {"id": rid, "kind": "long", "model": model, "pi": pi, "stream": True, kind: True}
        else:
            req = body(kind, model, pi, stream)
            rec = {"id": rid, "kind": kind, "model": model, "pi": pi, "stream": stream}
        req["id"] = rid
        rec["req"] = req
        return rec

    def cancel_flow(conn, rec):
        """A long streamed request, cancelled after its first token; both finals read."""
        conn.send(rec)
        while True:
            got, ev = conn.read()
            if got is rec or ev.get("event") == "token":
                break
        tally.add("cancel_targets")
        if got is rec:  # ended before the first token (no cancel to send)
            return
        cid = new_id()
        crec = {"id": cid, "kind": "op", "req": {"op": "cancel", "id": cid, "target": rec["id"]}}
        conn.send(crec)
        tally.add("cancel_ops")
        ends = {}
        while len(ends) < 2:
            got, ev = conn.read()
            if got is rec or got is crec:
                ends["t" if got is rec else "c"] = ev
        found = ends["c"].get("found")
        fr = ends["t"].get("finish_reason")
        if found is not (fr == "cancelled"):
            tally.problem("client %d: cancel answered found=%r but the target ended %r"
                          % (k, found, ends["t"]))
        if fr != "cancelled":
            tally.add("cancel_too_late")

    def disconnect_flow(rec):
        """A long streamed request on a connection of its own, closed after the first token."""
        conn = Conn(d, refs, tally, "client %d (disconnecting)" % k)
        conn.send(rec)
        ev = conn.c.recv()
        if ev.get("id") != rec["id"] or ev.get("event") != "token":
            tally.problem("client %d: wanted a first token for %r, got %r" % (k, rec["id"], ev))
        conn.abandon()
        tally.add("disconnects")

    # cancel and disconnect targets: prompts that run to LONG_TOKENS on that model when left
    # alone (random weights end some early with eos)
    long_prompts = {}
    for name in NAMES:
        have = [pi for pi in range(len(PROMPTS)) if ("long", name, pi) in refs]
        runs = [pi for pi in have if refs[("long", name, pi)]["finish_reason"] == "length"]
        long_prompts[name] = runs or have

    sent = 0
    session = 0
    try:
        while sent < quota and not stop_flag.is_set():
            session += 1
            mode = rnd.random()
            rec = pick(allow_long=True)
            if rec.get("disconnect"):
                disconnect_flow(rec)
                sent += 1
                continue
            tag = "client %d session %d" % (k, session)
            conn = Conn(d, refs, tally, tag)
            if mode < 0.3:
                # one request, then close (no sentinel: the next connection is new)
                if rec.get("cancel"):
                    cancel_flow(conn, rec)
                else:
                    conn.send(rec)
                    conn.drain()
                conn.c.close()
                sent += 1
            elif mode < 0.7:
                # several requests one after another on one connection
                n = rnd.randint(2, 6)
                for i in range(n):
                    if i:
                        rec = pick(allow_long=True)
                        if rec.get("disconnect"):
                            rec = pick(allow_long=False)
                    if rec.get("cancel"):
                        cancel_flow(conn, rec)
                    else:
                        conn.send(rec)
                        conn.drain()
                    sent += 1
                conn.close_checked("end-%d-%d" % (k, session))
            else:
                # several requests in flight at once on one connection
                n = rnd.randint(2, 5)
                batch = [] if rec.get("cancel") else [rec]
                bad_json = any(r["id"] is None for r in batch)
                while len(batch) < n:
                    r = pick(allow_long=False)
                    if r["id"] is None:
                        if bad_json:
                            continue  # one id-null answer in flight at a time
                        bad_json = True
                    batch.append(r)
                for r in batch:
                    conn.send(r)
                conn.drain()
                sent += len(batch)
                conn.close_checked("end-%d-%d" % (k, session))
    except Exception as e:  # a timeout, a closed connection, a bad line
        tally.problem("client %d: %r" % (k, e))
    tally.add("requests", sent)


# ------------------------------------------------------------------ the daemon's side

def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def model_totals(st):
    keys = ("total_page_ins", "evictions_capacity", "total_requests", "total_completed",
            "total_cancelled", "total_failed", "total_kv_allocs", "total_kv_frees",
            "total_kv_demotions", "total_kv_host_drops", "total_kv_restores", "curr_kv_host_bytes")
    return {k: sum(m[k] for m in st["models"].values()) for k in keys}


def idle(d, want_fds, timeout=10):
    """Waits until no sequence runs or holds a KV cache and the fd count is want_fds
    (None: stable); returns (stats, fds)."""
    deadline = time.time() + gsd.scaled(timeout)
    last = None
    while True:
        st = d.stats()
        time.sleep(0.1)  # the admin connection of stats() is closed: let the daemon see it
        fds = fd_count(d.proc.pid)
        quiet = all(m["curr_kv_seqs"] == 0 and m["curr_running"] == 0 for m in st["models"].values())
        t = model_totals(st)
        settled = t["total_requests"] == t["total_completed"] + t["total_cancelled"] + t["total_failed"]
        fds_ok = fds == want_fds if want_fds is not None else fds == last
        if (quiet and settled and fds_ok) or time.time() > deadline:
            return st, fds
        last = fds
        time.sleep(0.1)


def solo(d, req):
    """One request alone on a fresh connection: (final, streamed texts)."""
    c = d.client()
    try:
        c.send(req)
        ev, toks = c.final(req["id"])
        return ev, [t["text"] for t in toks]
    finally:
        c.close()


def references(d):
    """Every (kind, model, prompt) output, each from a request alone; greedy generate
    also checked against the one-shot engine (gpuswapd generate) for one prompt per model.
    This is the sequential warm-up round over all 8 models."""
    refs = {}
    for name, path, _ in MODELS:
        for kind, n in (("gen", len(PROMPTS)), ("chat", len(CHATS)), ("seeded", len(PROMPTS)),
                        ("long", len(PROMPTS))):
            for pi in range(n):
                req = body(kind, name, pi, stream=pi % 2 == 1)
                req["id"] = "ref"
                ev, toks = solo(d, req)
                assert ev.get("event") == "done", (kind, name, pi, ev)
                if req["stream"]:
                    assert "".join(toks) == ev["text"], (toks, ev)
                refs[(kind, name, pi)] = ev
                if kind == "long" and gsd.VALGRIND and ev["finish_reason"] == "length":
                    break  # memcheck: one long target per model is enough (and costly)
        cli = gsd.generate_cli(path, PROMPTS[0], MAX_TOKENS)
        assert cli["text"] == refs[("gen", name, 0)]["text"], (name, cli, refs[("gen", name, 0)])
    return refs


def concurrent_round(d, refs, tally):
    """The concurrent warm-up round: 64 clients at once, one greedy request each,
    over all 8 models, half streamed."""
    def one(k):
        try:
            conn = Conn(d, refs, tally, "warm-up %d" % k)
            kind = "chat" if k % 3 == 0 else "gen"
            req = body(kind, NAMES[k % N_MODELS], k, stream=k % 2 == 0)
            req["id"] = k
            conn.send({"id": k, "kind": kind, "model": req["model"], "pi": k, "stream": req["stream"],
                       "req": req})
            conn.drain()
            conn.c.close()
        except Exception as e:
            tally.problem("warm-up %d: %r" % (k, e))
    threads = [threading.Thread(target=one, args=(k,)) for k in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(gsd.scaled(60))


# ------------------------------------------------------------------ the test

def test_64_clients_thousands_of_mixed_requests_over_8_models_in_a_pool_of_two():
    # a small host KV tier: full from the warm-up on, it copies and drops cached KV all along
    d = gsd.Daemon(MODELS, memory=POOL, page="64KiB", extra="host:\n  kv_cache: %dB\n" % HOST_KV)
    try:
        pid = d.proc.pid
        info = d.admin_call({"op": "models", "id": "m"})["models"]
        weights = [m["weight_bytes"] for m in info]
        pool = d.stats()["pool"]
        pool_bytes = pool["curr_pool_pages"] * pool["page_size"]
        assert 2 * max(weights) < pool_bytes < 3 * min(weights), (weights, pool)

        t0 = time.time()
        refs = references(d)
        warm = Tally()
        concurrent_round(d, refs, warm)
        assert not warm.problems, warm.problems[:10]
        st0, fds0 = idle(d, None)
        rss0 = rss_kib(pid)
        tot0 = model_totals(st0)
        srv0 = st0["server"]
        t_warm = time.time() - t0

        tally = Tally()
        stop_flag = threading.Event()
        per = [N_REQUESTS // N_CLIENTS + (1 if k < N_REQUESTS % N_CLIENTS else 0) for k in range(N_CLIENTS)]
        threads = [threading.Thread(target=client, args=(d, refs, tally, k, per[k], stop_flag))
                   for k in range(N_CLIENTS)]
        t1 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(gsd.scaled(300))
        stop_flag.set()
        hung = sum(t.is_alive() for t in threads)
        t_load = time.time() - t1

        st1, fds1 = idle(d, fds0)
        rss1 = rss_kib(pid)
        tot1 = model_totals(st1)
        srv1 = st1["server"]
        delta = {k: tot1[k] - tot0[k] for k in tot0}
        n = tally.counts
        errs = {k[6:]: v for k, v in sorted(n.items()) if k.startswith("error_")}
        print("   load: %d requests (%d lines with cancels and sentinels), %d finals, errors %s, "
              "%d cancel targets (%d cancelled mid-generation, %d finished first), %d disconnects, "
              "%d page-ins, %d capacity evictions, %.1f s (+%.1f s warm-up); fds %d -> %d; "
              "VmRSS %d -> %d KiB (%+d, tolerance %d)%s"
              % (tally.get("requests"), tally.get("lines_sent"), tally.get("finals"),
                 json.dumps(errs, sort_keys=True), tally.get("cancel_targets"),
                 tally.get("cancelled_mid_generation"), tally.get("cancel_too_late"),
                 tally.get("disconnects"), delta["total_page_ins"], delta["evictions_capacity"], t_load,
                 t_warm, fds0, fds1, rss0, rss1, rss1 - rss0, RSS_TOLERANCE_KIB,
                 " (not checked under %s)" % RSS_UNCHECKED if RSS_UNCHECKED else ""), flush=True)

        assert hung == 0, "%d clients did not finish" % hung
        assert not tally.problems, "%d problems:\n%s" % (len(tally.problems), "\n".join(tally.problems[:20]))
        assert tally.get("requests") >= N_REQUESTS, n
        # every line sent but the disconnects' got its final line
        assert tally.get("finals") == tally.get("lines_sent") - tally.get("disconnects"), n
        assert tally.get("matched_gen") and tally.get("matched_chat") and tally.get("matched_seeded"), n
        assert tally.get("cancelled_mid_generation") > 0 and tally.get("disconnects") > 0, n
        for code in ("bad_json", "unknown_model", "bad_request"):
            assert srv1["total_errors_" + code] - srv0["total_errors_" + code] == n.get("error_" + code, 0), \
                (code, srv0, srv1, n)
        # the pool holds two models: the load paged every model in and evicted
        per_model = {name: st1["models"][name]["total_page_ins"] - st0["models"][name]["total_page_ins"]
                     for name in NAMES}
        assert all(v > 0 for v in per_model.values()), per_model
        assert delta["evictions_capacity"] > 0, delta
        # the host tier was full and busy: copies in, dropped, back; never over its budget
        print("   host KV tier (%d B): %d demotions, %d drops, %d restores; %d B held at the end"
              % (HOST_KV, delta["total_kv_demotions"], delta["total_kv_host_drops"],
                 delta["total_kv_restores"], tot1["curr_kv_host_bytes"]), flush=True)
        assert delta["total_kv_demotions"] > 0 and delta["total_kv_host_drops"] > 0, delta
        assert tot1["curr_kv_host_bytes"] <= HOST_KV, tot1
        # every accepted request ended; the cancelled ones are the cancels that hit and at most
        # the disconnects
        assert delta["total_requests"] == delta["total_completed"] + delta["total_cancelled"] + \
            delta["total_failed"], delta
        assert tally.get("cancelled_mid_generation") <= delta["total_cancelled"] <= \
            tally.get("cancelled_mid_generation") + tally.get("disconnects"), (delta, n)
        # back to idle: no sequence, no KV cache, no connection left
        for name, m in st1["models"].items():
            assert m["curr_kv_seqs"] == 0 and m["curr_kv_bytes"] == 0 and m["curr_running"] == 0, (name, m)
            assert m["total_kv_allocs"] == m["total_kv_frees"], (name, m)
        assert srv1["curr_connections"] == 1, srv1  # the admin connection asking
        assert fds1 == fds0, (fds0, fds1, sorted(os.listdir("/proc/%d/fd" % pid)))
        if not RSS_UNCHECKED:
            assert rss1 - rss0 <= RSS_TOLERANCE_KIB, (rss0, rss1, RSS_TOLERANCE_KIB)
        # and it still answers as before
        ev, _ = solo(d, dict(body("gen", "m3", 1, False), id="after"))
        assert ev["text"] == refs[("gen", "m3", 1)]["text"], ev
    finally:
        rc = d.stop()
    assert rc == 0, "exit status %r\n%s" % (rc, d.logtext()[-3000:])


if __name__ == "__main__":
    r = gsd.Runner()
    r.run(test_64_clients_thousands_of_mixed_requests_over_8_models_in_a_pool_of_two)
    sys.exit(r.exit_code())
