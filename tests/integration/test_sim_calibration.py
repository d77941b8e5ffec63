"""The trace simulator's cost model against the real daemon on sim: one small recorded workload, page-ins equal, latencies within 20%."""
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TRACESIM = os.path.join(gsd.BUILD, "tracesim")
TMP = tempfile.mkdtemp(prefix="gsd-simcal-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
N_MODELS = 4
# each model is 24 pages of 64 KiB (1.5 MiB); a 4 MiB pool holds two plus
# room for KV caches. The copy throttle makes a whole page-in ~31 ms, far
# more than a step of compute (well under a millisecond), so latencies are
# copy-dominated and predictable.
PAGE = 64 * 1024
POOL = 4 * 1024 * 1024
BANDWIDTH = 48 * 1024 * 1024  # bytes/s (device.sim_bandwidth)
N_REQUESTS = 32
SPACING_S = 0.15  # every request is done long before the next arrives
PROMPT_LENS = [8, 16, 32, 48]
MAX_TOKENS = 12
TOLERANCE = 0.20


class ThrottledDaemon(gsd.Daemon):
    """gsd.Daemon with device.sim_bandwidth set."""

    def write_config(self, models, memory="2MiB", page="64KiB", extra="", scheduler=""):
        super().write_config(models, memory, page, extra, scheduler)
        with open(self.config) as f:
            text = f.read()
        text = text.replace("  threads: 1\n", "  threads: 1\n  sim_bandwidth: %dB/s\n" % BANDWIDTH, 1)
        with open(self.config, "w") as f:
            f.write(text)


def make_models():
    return [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 11)), "")
            for i in range(N_MODELS)]


def make_trace(seed=5):
    """The recorded workload: (arrival_s, model, prompt tokens); locality with
    switches, so there are hits, whole page-ins and partial ones."""
    rnd = random.Random(seed)
    trace, m = [], 0
    for i in range(N_REQUESTS):
        if i and rnd.random() < 0.6:
            m = rnd.choice([x for x in range(N_MODELS) if x != m])
        p = rnd.choice(PROMPT_LENS)
        toks = [rnd.randrange(3, 400) for _ in range(p)]
        trace.append((round(i * SPACING_S, 3), m, toks))
    return trace


def gen(c, rid, model, toks):
    return c.call({"op": "generate", "id": rid, "model": "m%d" % model, "tokens": toks,
                   "max_tokens": MAX_TOKENS, "temperature": 0})


def calibrate(models, trace):
    """On a daemon whose pool holds every model: the copy latency per segment
    from the cold page-ins, compute per step and per token from resident
    requests; and a check that every prompt of the trace runs to max_tokens
    (no early EOS), re-drawing the ones that do not."""
    d = ThrottledDaemon(models, memory="16MiB")
    try:
        c = d.client()
        for m in range(N_MODELS):
            ev = gen(c, "cold%d" % m, m, [5, 6, 7])
            assert ev["event"] == "done", ev
        st = d.stats()["models"]
        copy_s = sum(v["total_copy_ns"] for v in st.values()) / 1e9
        bytes_in = sum(v["total_bytes_in"] for v in st.values())
        page_ins = sum(v["total_page_ins"] for v in st.values())
        copy_lat = max(0.0, (copy_s - bytes_in / BANDWIDTH) / page_ins)
        rnd = random.Random(99)
        points = []  # (tokens in the step, seconds)
        for k, (t, m, toks) in enumerate(trace):
            for attempt in range(20):
                ev = gen(c, "cal%d" % k, m, toks)
                assert ev["event"] == "done", ev
                if ev["usage"]["completion_tokens"] == MAX_TOKENS:
                    break
                toks = [rnd.randrange(3, 400) for _ in toks]
            else:
                raise AssertionError("no prompt of %d tokens for m%d runs to max_tokens" % (len(toks), m))
            trace[k] = (t, m, toks)
            tm = ev["timing"]
            assert not tm["swapped"], ev
            points.append((len(toks), tm["ttft_ms"] / 1e3))
            points.append((1, (tm["total_ms"] - tm["ttft_ms"]) / 1e3 / (MAX_TOKENS - 1)))
        c.close()
    finally:
        assert d.stop() == 0
    # least squares: step seconds = t_step + t_token * tokens
    n = len(points)
    mx = sum(p for p, _ in points) / n
    my = sum(s for _, s in points) / n
    sxx = sum((p - mx) ** 2 for p, _ in points)
    sxy = sum((p - mx) * (s - my) for p, s in points)
    t_token = max(0.0, sxy / sxx)
    t_step = max(0.0, my - t_token * mx)
    return copy_lat, t_step, t_token


def measure(models, trace):
    """Replays the trace on the daemon at its recorded times; returns the done
    events by index and the stats."""
    d = ThrottledDaemon(models, memory="%dB" % POOL)
    try:
        c = d.client()
        done = {}
        late = []
        errors = []

        def reader():
            try:
                while len(done) < len(trace):
                    ev = c.recv()
                    if ev.get("event") == "token":
                        continue
                    done[ev["id"]] = ev
            except Exception as e:  # reported by the caller
                errors.append(repr(e))

        th = threading.Thread(target=reader)
        th.start()
        t0 = time.monotonic() + 0.05
        for k, (t, m, toks) in enumerate(trace):
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if k and (k - 1) not in done:
                late.append(k)
            c.send({"op": "generate", "id": k, "model": "m%d" % m, "tokens": toks,
                    "max_tokens": MAX_TOKENS, "temperature": 0})
        th.join(60)
        c.close()
        stats = d.stats()
    finally:
        assert d.stop() == 0
    assert not errors, errors
    assert len(done) == len(trace), "%d of %d answers" % (len(done), len(trace))
    return done, stats, late


def simulate(models, trace, copy_lat, t_step, t_token):
    req = os.path.join(TMP, "requests.txt")
    with open(req, "w") as f:
        f.write("# arrival_s model prompt_tokens output_tokens\n")
        for t, m, toks in trace:
            f.write("%.3f %d %d %d\n" % (t, m, len(toks), MAX_TOKENS))
    dump = os.path.join(TMP, "sim_requests.csv")
    csv = os.path.join(TMP, "sim.csv")
    cmd = [TRACESIM, "--gguf", ",".join(p for _, p, _ in models), "--requests", req,
           "--page-mib", repr(PAGE / 1048576.0), "--pool-gib", repr(POOL / 1073741824.0),
           "--h2d-gbs", repr(BANDWIDTH / 1e9), "--copy-lat-us", repr(copy_lat * 1e6),
           "--hbm-gbs", "0", "--tflops", "0", "--t-fixed-ms", "0",
           "--t-step-ms", repr(t_step * 1e3), "--t-token-ms", repr(t_token * 1e3),
           "--max-batch", "16", "--max-wait", "2", "--quantum", "4",
           "--policies", "default", "--dump-requests", dump, "--csv", csv, "--quiet"]
    subprocess.run(cmd, check=True)
    with open(csv) as f:
        head, row = [l.strip().split(",") for l in f.readlines()[:2]]
    totals = dict(zip(head, row))
    per = {}
    with open(dump) as f:
        head = f.readline().strip().split(",")
        for line in f:
            r = dict(zip(head, line.strip().split(",")))
            per[int(r["index"])] = r
    return totals, per


def main():
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
        if ok:
            passed += 1
        else:
            failed += 1

    t_all = time.time()
    models = make_models()
    trace = make_trace()
    copy_lat, t_step, t_token = calibrate(models, trace)
    print("calibrated: copy latency %.0f us/segment, compute %.3f ms/step + %.4f ms/token"
          % (copy_lat * 1e6, t_step * 1e3, t_token * 1e3), flush=True)
    done, stats, late = measure(models, trace)
    totals, per = simulate(models, trace, copy_lat, t_step, t_token)

    check(not late, "replay: every request finished before the next was sent (late: %s)" % late)
    full = [k for k, ev in done.items()
            if ev.get("event") != "done" or ev["usage"]["completion_tokens"] != MAX_TOKENS]
    check(not full, "daemon: every request done with %d tokens (not: %s)" % (MAX_TOKENS, full))
    check(int(totals["completed"]) == len(trace), "simulator: %s of %d requests completed"
          % (totals["completed"], len(trace)))
    measured_pi = sum(m["total_page_ins"] for m in stats["models"].values())
    swapped = sum(1 for ev in done.values() if ev["timing"]["swapped"])
    check(measured_pi == int(totals["page_ins"]),
          "page-ins: daemon %d, simulator %s (%d of %d requests swapped)"
          % (measured_pi, totals["page_ins"], swapped, len(trace)))
    for key, col, name in (("ttft_ms", "ttft_s", "TTFT"), ("total_ms", "e2e_s", "end-to-end latency")):
        meas = [done[k]["timing"][key] / 1e3 for k in range(len(trace))]
        pred = [float(per[k][col]) for k in range(len(trace))]
        mm, mp = sum(meas) / len(meas), sum(pred) / len(pred)
        err = abs(mp - mm) / mm
        worst = max(range(len(trace)), key=lambda k: abs(pred[k] - meas[k]))
        check(err <= TOLERANCE,
              "mean %s: daemon %.2f ms, simulator %.2f ms (%.1f%% off, want <= %.0f%%); worst request "
              "%d: %.2f vs %.2f ms" % (name, mm * 1e3, mp * 1e3, err * 100, TOLERANCE * 100, worst,
                                       meas[worst] * 1e3, pred[worst] * 1e3))
    print("(%.1fs)" % (time.time() - t_all))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
