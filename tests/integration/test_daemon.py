"""The real daemon on the sim backend over its real sockets: concurrency, greedy equivalence, stats, policies, errors, disconnects, reload, drain."""
import os
import random
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-models-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODELS = [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 1)), "")
          for i in range(4)]
# each model is 24 pages of 64 KiB (1.5 MiB); a 4 MiB pool holds two, with room
# for the KV caches of a few sequences (at least two pages each)
POOL = "4MiB"
PROMPTS = ["Once upon a time", "The cat", "Lily went to the park", "hello world"]


def test_concurrent_clients_get_one_answer_each_equal_to_generate():
    d = gsd.Daemon(MODELS, memory=POOL)
    try:
        want = {}
        for name, path, _ in MODELS:
            for p in PROMPTS:
                want[(name, p)] = gsd.generate_cli(path, p, 12)
        results = {}
        errors = []

        def client(k):
            rnd = random.Random(k)
            c = d.client()
            try:
                sent = []
                for j in range(6):
                    name = rnd.choice(MODELS)[0]
                    p = rnd.choice(PROMPTS)
                    rid = "c%d-%d" % (k, j)
                    c.send({"op": "generate", "id": rid, "model": name, "prompt": p,
                            "max_tokens": 12, "temperature": 0, "stream": j % 2 == 0})
                    sent.append((rid, name, p))
                got = {}
                while len(got) < len(sent):
                    ev = c.recv()
                    if ev.get("event") == "token":
                        continue
                    if ev["id"] in got:
                        errors.append("two final answers for %s" % ev["id"])
                    got[ev["id"]] = ev
                for rid, name, p in sent:
                    results[rid] = (name, p, got[rid])
            except Exception as e:
                errors.append("client %d: %r" % (k, e))
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len(results) == 36, len(results)
        for rid, (name, p, ev) in results.items():
            assert ev["event"] == "done", ev
            w = want[(name, p)]
            assert ev["text"] == w["text"], (rid, ev["text"], w["text"])
            assert ev["usage"]["completion_tokens"] == 12
            assert ev["usage"]["prompt_tokens"] == len(w["prompt_ids"])
        st = d.stats()
        models = st["models"]
        assert sum(m["total_requests"] for m in models.values()) == 36
        assert sum(m["total_completed"] for m in models.values()) == 36
        page_ins = sum(m["total_page_ins"] for m in models.values())
        evictions = sum(m["evictions_capacity"] for m in models.values())
        used = set(n for n, _, _ in results.values())
        # every model used was paged in at least once (6 segments each), and
        # four models cannot share a pool that holds two without evicting
        assert page_ins >= 6 * len(used), page_ins
        assert evictions > 0, models
        pool = st["pool"]
        resident = sum(m["curr_resident_bytes"] + m["curr_kv_bytes"] + m["curr_kv_cached_bytes"]
                       for m in models.values())
        assert resident == pool["curr_pool_used"] * pool["page_size"], (resident, pool)
        assert all(m["curr_kv_seqs"] == 0 for m in models.values())
        # bytes in = page-ins x segment spans: every page-in copied whole pages
        for m in models.values():
            assert m["total_bytes_in"] % pool["page_size"] == 0
    finally:
        assert d.stop() == 0


# max_wait stretched with every other time under memcheck, where a step takes 20-50x longer: a
# fixed 2 s would expire on every request there and force a switch each time
MAX_WAIT_MS = int(gsd.scaled(2000))


def run_policy(policy, order):
    """(page-ins, final answers by id, seconds the worker waited for a CPU while each was queued:
    a loaded host's share of its queue_ms, gsd.RunWait)."""
    d = gsd.Daemon(MODELS, memory=POOL,
                   scheduler="policy: %s\nmax_wait: %dms\nquantum: 4\nmax_batch: 6" % (policy, MAX_WAIT_MS))
    wait = gsd.RunWait(d)
    try:
        c = d.client()
        for i, name in enumerate(order):
            c.send({"op": "generate", "id": i, "model": name, "prompt": PROMPTS[i % 4],
                    "max_tokens": 6, "temperature": 0})
        finals, seen = {}, {}
        while len(finals) < len(order):
            ev = c.recv()
            finals[ev["id"]] = ev
            seen[ev["id"]] = time.monotonic()
        c.close()
        st = d.stats()
        page_ins = sum(m["total_page_ins"] for m in st["models"].values())
        waited = {}
        for rid, ev in finals.items():
            t = ev.get("timing")
            if t:  # queued from (answer - total) to (answer - total + queue), at most
                start = seen[rid] - t["total_ms"] / 1e3
                waited[rid] = wait.waited(start, start + t["queue_ms"] / 1e3, (gsd.RunWait.WORKER,))
        return page_ins, finals, waited
    finally:
        wait.close()
        d.stop()


def test_swap_aware_pages_in_at_least_3x_less_than_fifo_and_bounds_waiting():
    # a recorded interleaved sequence: round robin over four models, 48 requests
    order = ["m%d" % (i % 4) for i in range(48)]
    sa, sa_final, sa_waited = run_policy("swap-aware", order)
    ff, ff_final, _ = run_policy("fifo", order)
    print("   page-ins: swap-aware %d, fifo %d (%.1fx)" % (sa, ff, ff / max(sa, 1)))
    bad = [e for e in list(sa_final.values()) + list(ff_final.values()) if e["event"] != "done"]
    assert not bad, bad[:3]
    # under memcheck a step costs 20-50x more while the copy thread's memcpy slows less, so the
    # policy's trade-off shifts (measured there: 2.25x); it must still never page in more than fifo
    assert ff >= (3 if gsd.TIMEOUT_FACTOR == 1 else 1) * sa, (sa, ff)
    # max_wait plus one quantum (4 x swap-in time, at least 50 ms) and the step under way when
    # the wait ran out, plus what the worker waited for a CPU meanwhile (a loaded host's share)
    over = [(e["timing"]["queue_ms"], 1e3 * sa_waited[rid]) for rid, e in sa_final.items()
            if e["timing"]["queue_ms"] > MAX_WAIT_MS + gsd.scaled(250) + 1e3 * sa_waited[rid]]
    worst = max(e["timing"]["queue_ms"] for e in sa_final.values())
    print("   swap-aware: longest queue_ms %.0f (max_wait %d ms)" % (worst, MAX_WAIT_MS))
    assert not over, over


def test_every_error_code_and_the_connection_survives():
    d = gsd.Daemon(MODELS[:2], memory=POOL,
                   extra="", scheduler="queue_limit: 2\nmax_queued: 4")
    try:
        c = d.client()
        c.send_raw(b"{not json\n")
        ev = c.recv()
        assert ev["error"]["code"] == "bad_json" and ev["id"] is None, ev
        ev = c.call({"op": "generate", "id": "u1", "model": "m0", "prompt": "x", "max_token": 3})
        assert ev["error"]["code"] == "bad_request" and "max_token" in ev["error"]["message"], ev
        ev = c.call({"op": "generate", "id": "u2", "model": "nope", "prompt": "x"})
        assert ev["error"]["code"] == "unknown_model" and "m0" in ev["error"]["message"], ev
        ev = c.call({"op": "generate", "id": "u3", "model": "m0", "prompt": "x", "max_tokens": 100000})
        assert ev["error"]["code"] == "context_overflow", ev
        # the connection is still usable
        ev = c.call({"op": "generate", "id": "ok1", "model": "m0", "prompt": "x", "max_tokens": 2,
                     "temperature": 0})
        assert ev["event"] == "done", ev
        # overloaded: more than queue_limit at once for one model
        for i in range(8):
            c.send({"op": "generate", "id": "q%d" % i, "model": "m1", "prompt": "hello",
                    "max_tokens": 30, "temperature": 0})
        codes = []
        for _ in range(8):
            ev = c.recv()
            while ev.get("event") == "token":
                ev = c.recv()
            codes.append(ev.get("error", {}).get("code", ev.get("finish_reason")))
        assert "overloaded" in codes, codes
        # cancel: the target ends with finish_reason cancelled
        c.send({"op": "generate", "id": "long", "model": "m0", "prompt": "x", "max_tokens": 400,
                "temperature": 0, "stream": True})
        ev = c.recv()
        assert ev["event"] == "token", ev
        c.send({"op": "cancel", "id": "cx", "target": "long"})
        seen = {}
        while len(seen) < 2:
            ev = c.recv()
            if ev.get("event") == "token":
                continue
            seen[ev["id"]] = ev
        assert seen["cx"]["ok"] and seen["cx"]["found"], seen
        assert seen["long"]["finish_reason"] == "cancelled", seen["long"]
        # admin ops are refused on the inference socket
        ev = c.call({"op": "stats", "id": "s"})
        assert ev["error"]["code"] == "bad_request", ev
        # too_large: a line over listen.max_line closes the connection
        c.send_raw(b'{"op":"models","id":1,"pad":"' + b"x" * (1 << 20) + b'"}\n')
        ev = c.recv()
        assert ev["error"]["code"] == "too_large", ev
        try:
            c.recv()
            assert False, "connection stayed open after too_large"
        except (EOFError, ConnectionResetError):
            pass
        st = d.stats()["server"]
        for code in ("bad_json", "bad_request", "unknown_model", "context_overflow", "overloaded",
                     "too_large"):
            assert st["total_errors_" + code] >= 1, (code, st)
    finally:
        assert d.stop() == 0


def test_a_client_vanishing_mid_stream_frees_its_kv_cache():
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    try:
        c = d.client()
        c.send({"op": "generate", "id": 1, "model": "m0", "prompt": "Once", "max_tokens": 1000,
                "temperature": 0, "stream": True})
        ev = c.recv()
        assert ev["event"] == "token"
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        deadline = time.time() + 10
        while True:
            m = d.stats()["models"]["m0"]
            if m["curr_kv_seqs"] == 0 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert m["curr_kv_seqs"] == 0 and m["curr_kv_bytes"] == 0, m
        assert m["total_kv_allocs"] == m["total_kv_frees"] == 1, m
        assert m["total_cancelled"] == 1 and m["total_completed"] == 0, m
        # and the daemon keeps serving everyone else
        c2 = d.client()
        assert c2.call({"op": "generate", "id": 2, "model": "m0", "prompt": "hi", "max_tokens": 2})["event"] == "done"
        c2.close()
    finally:
        assert d.stop() == 0


def test_reload_applies_a_good_file_and_refuses_a_bad_one():
    d = gsd.Daemon(MODELS[:2], memory=POOL)
    try:
        c = d.client()
        d.write_config(MODELS[:3], memory=POOL)
        d.signal(signal.SIGHUP)
        deadline = time.time() + 10
        names = []
        while time.time() < deadline:
            names = [m["name"] for m in c.call({"op": "models", "id": "m"})["models"]]
            if "m2" in names:
                break
            time.sleep(0.05)
        assert names == ["m0", "m1", "m2"], names
        assert c.call({"op": "generate", "id": 1, "model": "m2", "prompt": "x", "max_tokens": 2})["event"] == "done"
        # a bad file: refused, old config keeps running
        with open(d.config, "a") as f:
            f.write("    gpu_qouta: 1MiB\n")
        d.signal(signal.SIGHUP)
        time.sleep(0.3)
        assert "reload refused" in d.logtext() and "gpu_qouta" in d.logtext(), d.logtext()
        ans = d.admin_call({"op": "reload", "id": "r"})
        assert ans["error"]["code"] == "bad_request" and "gpu_qouta" in ans["error"]["message"], ans
        assert c.call({"op": "generate", "id": 2, "model": "m2", "prompt": "x", "max_tokens": 2})["event"] == "done"
        # removing a model through the admin reload: its queued requests end
        # with the error cancelled, the one generating finishes
        one_at_a_time = [MODELS[0], MODELS[1], (MODELS[2][0], MODELS[2][1], "max_batch: 1")]
        d.write_config(one_at_a_time, memory=POOL)
        assert d.admin_call({"op": "reload", "id": "r1"})["changed"] == ["m2"]
        c2 = d.client()
        c2.send({"op": "generate", "id": "run", "model": "m2", "prompt": "x", "max_tokens": 1000,
                 "temperature": 0, "stream": True})
        assert c2.recv()["event"] == "token"
        for i in range(3):
            c2.send({"op": "generate", "id": "wait%d" % i, "model": "m2", "prompt": "x",
                     "max_tokens": 5})
        d.write_config(MODELS[:1], memory=POOL)
        ans = d.admin_call({"op": "reload", "id": "r2"})
        assert ans["ok"] and ans["removed"] == ["m1", "m2"], ans
        ev = c.call({"op": "generate", "id": 3, "model": "m1", "prompt": "x"})
        assert ev["error"]["code"] == "unknown_model", ev
        ends = {}
        while len(ends) < 4:
            e = c2.recv()
            if e.get("event") != "token":
                ends[e["id"]] = e
        assert ends["run"]["event"] == "done", ends["run"]
        codes = [ends["wait%d" % i].get("error", {}).get("code", ends["wait%d" % i].get("finish_reason"))
                 for i in range(3)]
        assert codes == ["cancelled"] * 3, codes
        c2.close()
        c.close()
    finally:
        assert d.stop() == 0


def test_sigterm_drains_in_flight_work_and_exits_zero():
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    c = d.client()
    # long enough to be running still when "late" arrives 0.2 s after the SIGTERM
    c.send({"op": "generate", "id": "inflight", "model": "m0", "prompt": "Once", "max_tokens": 600,
            "temperature": 0, "stream": True})
    assert c.recv()["event"] == "token"
    d.signal(signal.SIGTERM)
    time.sleep(0.2)
    c.send({"op": "generate", "id": "late", "model": "m0", "prompt": "x", "max_tokens": 2})
    ends = {}
    while len(ends) < 2:
        e = c.recv()
        if e.get("event") != "token":
            ends[e["id"]] = e
    assert ends["late"]["error"]["code"] == "shutting_down", ends["late"]
    ev = ends["inflight"]
    assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 600, ev
    assert d.proc.wait(gsd.scaled(30)) == 0
    assert not os.path.exists(d.sock), "inference socket left behind"
    c.close()
    d.log.close()


def test_stop_strings_end_the_text_before_them_also_when_streaming():
    want = gsd.generate_cli(MODELS[0][1], "Once upon a time", 16)["text"]
    printable = [i for i in range(2, len(want) - 2) if want[i:i + 2].isascii() and want[i:i + 2].strip()]
    assert printable, want
    cut = printable[0]
    stop = want[cut:cut + 2]
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    try:
        c = d.client()
        for stream in (False, True):
            c.send({"op": "generate", "id": "s", "model": "m0", "prompt": "Once upon a time",
                    "max_tokens": 16, "temperature": 0, "stop": [stop], "stream": stream})
            ev, toks = c.final("s")
            assert ev["finish_reason"] == "stop", ev
            assert ev["text"] == want[:want.index(stop)], (ev["text"], want, stop)
            if stream:
                assert "".join(t["text"] for t in toks) == ev["text"], (toks, ev)
        c.close()
    finally:
        assert d.stop() == 0


def test_admin_load_evict_pin_and_peer_check():
    d = gsd.Daemon(MODELS[:3], memory=POOL)
    try:
        ans = d.admin_call({"op": "load", "id": "l", "model": "m1"})
        assert ans["ok"] and ans["state"] == "resident", ans
        ans = d.admin_call({"op": "pin", "id": "p", "model": "m1"})
        assert ans["pinned"] is True
        ans = d.admin_call({"op": "evict", "id": "e", "model": "m1"})
        assert ans["error"]["code"] == "bad_request", ans
        d.admin_call({"op": "unpin", "id": "u", "model": "m1"})
        ans = d.admin_call({"op": "evict", "id": "e2", "model": "m1"})
        assert ans["ok"] and ans["bytes_evicted"] > 0, ans
        st = d.stats()["models"]["m1"]
        assert st["evictions_admin"] == 6 and st["curr_resident_bytes"] == 0, st
        models = d.admin_call({"op": "models", "id": "m"})["models"]
        assert {m["name"] for m in models} == {"m0", "m1", "m2"}
        assert oct(os.stat(d.admin).st_mode & 0o777) == "0o600"
    finally:
        assert d.stop() == 0


def test_block_type_models_page_in_answer_like_generate_and_report_their_types():
    # a pool that holds one of the three: every switch pages a model in
    shape = "--dim 256 --layers 8 --heads 4 --kv-heads 2 --ff 512 --vocab 400 --seed 3"
    models = [(t, gsd.mkmodel(os.path.join(TMP, "k-%s.gguf" % t), "--type %s %s" % (t, shape)), "")
              for t in ("q4_k_m", "q6_k", "iq4_nl")]
    d = gsd.Daemon(models, memory="4MiB")
    try:
        c = d.client()
        for rnd in range(2):
            for name, path, _ in models:
                w = gsd.generate_cli(path, "Once upon a time", 8)
                ev = c.call({"op": "generate", "id": "%s-%d" % (name, rnd), "model": name,
                             "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
                assert ev["event"] == "done" and ev["text"] == w["text"], (name, ev, w["text"])
        ans = {m["name"]: m for m in c.call({"op": "models", "id": "m"})["models"]}
        c.close()
        # 8 layers x 7 matrices, token_embd and output (F32 norms): q4_k_m gives
        # output and attn_v/ffn_down of layers 0, 3, 6, 7 Q6_K
        k = ans["q4_k_m"]
        assert k["type"] == "q4_k", k
        assert k["tensor_types"] == {"f32": 17, "q4_k": 49, "q6_k": 9}, k  # layers 0, 3, 6, 7 wider
        assert 0.5 < k["bytes_per_param"] < 0.75, k  # ~4.8 bits a weight, F32 norms
        assert ans["q6_k"]["tensor_types"] == {"f32": 17, "q6_k": 58}, ans["q6_k"]
        assert abs(ans["q6_k"]["bytes_per_param"] - 210 / 256) < 0.02, ans["q6_k"]
        assert ans["iq4_nl"]["tensor_types"] == {"f32": 17, "iq4_nl": 58}, ans["iq4_nl"]
        st = d.stats()["models"]
        assert all(st[n]["total_page_ins"] >= 2 * 10 for n in ans), st
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_concurrent_clients_get_one_answer_each_equal_to_generate,
               test_swap_aware_pages_in_at_least_3x_less_than_fifo_and_bounds_waiting,
               test_every_error_code_and_the_connection_survives,
               test_a_client_vanishing_mid_stream_frees_its_kv_cache,
               test_reload_applies_a_good_file_and_refuses_a_bad_one,
               test_sigterm_drains_in_flight_work_and_exits_zero,
               test_stop_strings_end_the_text_before_them_also_when_streaming,
               test_admin_load_evict_pin_and_peer_check,
               test_block_type_models_page_in_answer_like_generate_and_report_their_types]:
        r.run(fn)
    sys.exit(r.exit_code())
