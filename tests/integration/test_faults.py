"""Faults injected through the sim backend and the host: failed, very slow and timed-out copies, failed maps
(device memory exhausted), corrupted and deleted model files around a reload, socket paths already taken,
logs on a full disk, SIGKILL and restart. Each: the affected requests get a typed error, everyone else is
served, the daemon neither crashes nor hangs, and it serves again afterwards."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-faults-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODELS = [("m%d" % i, gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 11)), "")
          for i in range(3)]
POOL = "4MiB"  # holds two of the models (1.5 MiB each) plus KV caches
PROMPT = "Once upon a time"
N = 8
WANT = {name: gsd.generate_cli(path, PROMPT, N)["text"] for name, path, _ in MODELS}


class FaultDaemon(gsd.Daemon):
    """gsd.Daemon with fault injection on and a chosen copy timeout."""

    def __init__(self, models, copy_timeout="2s", **kw):
        self.device_extra = ["  fault_injection: true", "  copy_timeout: %s" % copy_timeout]
        super().__init__(models, **kw)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read()
        text = text.replace("  threads: 1\n", "  threads: 1\n" + "\n".join(self.device_extra) + "\n", 1)
        with open(self.config, "w") as f:
            f.write(text)

    def fault(self, kind, count=1, delay_ms=0):
        req = {"op": "fault", "id": "f", "fault": kind, "count": count}
        if delay_ms:
            req["delay_ms"] = delay_ms
        ans = self.admin_call(req)
        assert ans.get("ok"), ans


def gen(d, model, rid="g", n=N):
    c = d.client()
    try:
        return c.call({"op": "generate", "id": rid, "model": model, "prompt": PROMPT, "max_tokens": n,
                       "temperature": 0})
    finally:
        c.close()


def assert_served(d, model, rid="ok"):
    ans = gen(d, model, rid)
    assert ans.get("event") == "done", ans
    assert ans["text"] == WANT[model], (model, ans["text"], WANT[model])


def assert_error(ans, code, words):
    assert ans.get("event") == "error", ans
    assert ans["error"]["code"] == code, ans
    assert words in ans["error"]["message"], ans


def fails_once_then_serves(d, model, fault, code, words):
    """With model paged out, one armed fault fails its request with code; the warm model m0 and then
    model itself are served correctly."""
    cold(d, model)
    d.fault(fault)
    assert_error(gen(d, model, "bad"), code, words)
    assert_served(d, "m0", "other")          # everyone else is served
    assert_served(d, model, "again")         # and the model pages in again, correctly


def cold(d, model):
    """Makes model absent from the device (evicts it)."""
    ans = d.admin_call({"op": "evict", "id": "e", "model": model})
    assert ans.get("ok"), ans


def test_fault_injection_is_refused_unless_configured():
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    try:
        ans = d.admin_call({"op": "fault", "id": 1, "fault": "copy_fail"})
        assert_error(ans, "bad_request", "fault injection is off")
        ans = d.admin_call({"op": "fault", "id": 2, "fault": "melt"})
        assert_error(ans, "bad_request", "must be one of")
        c = d.client()  # and never on the inference socket
        assert_error(c.call({"op": "fault", "id": 3, "fault": "copy_fail"}), "bad_request", "admin")
        c.close()
        assert_served(d, "m0")
    finally:
        assert d.stop() == 0


def test_a_failed_copy_fails_only_its_requests_and_the_model_pages_in_again():
    d = FaultDaemon(MODELS, memory=POOL)
    try:
        assert_served(d, "m0")
        fails_once_then_serves(d, "m1", "copy_fail", "internal", "failed to copy segment")
        st = d.stats()["models"]["m1"]
        assert st["total_device_errors"] == 1 and st["total_failed"] == 1, st
        assert st["curr_kv_seqs"] == 0, st
    finally:
        assert d.stop() == 0


def test_a_failed_map_evicts_idle_models_and_is_retried_within_a_lowered_budget():
    d = FaultDaemon(MODELS, memory=POOL)
    try:
        assert_served(d, "m0")
        cold(d, "m2")
        before = d.stats()
        d.fault("map_fail")
        assert_served(d, "m2", "retried")      # the map is retried after evicting the idle m0
        st = d.stats()
        assert st["pool"]["curr_budget_cut_bytes"] > 0, st["pool"]
        assert st["pool"]["curr_pool_pages"] < before["pool"]["curr_pool_pages"], st["pool"]
        assert st["models"]["m0"]["evictions_capacity"] > before["models"]["m0"]["evictions_capacity"], st
        assert st["models"]["m2"]["total_device_errors"] == 0, st["models"]["m2"]  # recovered: no error
        for name, _, _ in MODELS:                 # all served within the lowered budget
            assert_served(d, name, "after-" + name)
    finally:
        assert d.stop() == 0


def test_a_persistent_map_failure_evicts_retries_answers_overloaded_and_never_wedges():
    # no prefix cache: a finished request's cached KV would be the idle memory that a failed map
    # frees and retries with (test_prefix.py covers that), and this test needs none left
    d = FaultDaemon(MODELS, memory=POOL, scheduler="prefix_cache: false")
    try:
        assert_served(d, "m0")
        cold(d, "m1")
        # maps fail until something is freed: m1's page-in evicts the idle m0, then maps
        d.fault("map_short")
        assert_served(d, "m1", "evicts")
        st = d.stats()
        assert st["models"]["m0"]["evictions_capacity"] >= 1, st["models"]["m0"]
        assert st["pool"]["curr_budget_cut_bytes"] > 0, st["pool"]
        # nothing idle left to free: m1's KV cache cannot be mapped, the request is overloaded,
        # and again (the failure lasts), each answered at once
        cold(d, "m0")
        cold(d, "m2")
        d.fault("map_short")
        for rid in ("kv1", "kv2"):
            assert_error(gen(d, "m1", rid), "overloaded", "device memory exhausted")
        # another model is served meanwhile: its page-in evicts the now idle m1 and retries
        assert_served(d, "m0", "other")
        assert_served(d, "m1", "again")
        # with nothing mapped at all an admin load fails the same way, until the device gives again
        for name in ("m0", "m1", "m2"):
            cold(d, name)
        d.fault("map_short")
        assert_error(d.admin_call({"op": "load", "id": "l", "model": "m2"}), "overloaded",
                     "device memory exhausted")
        d.fault("off")
        ans = d.admin_call({"op": "load", "id": "l2", "model": "m2"})
        assert ans.get("ok"), ans
        for name, _, _ in MODELS:
            assert_served(d, name, "end-" + name)
        st = d.stats()
        for name, _, _ in MODELS:
            assert st["models"][name]["curr_kv_seqs"] == 0, st["models"][name]
    finally:
        assert d.stop() == 0


def test_a_failing_copy_during_an_admin_load_is_retried():
    d = FaultDaemon(MODELS, memory=POOL)
    try:
        cold(d, "m1")
        d.fault("copy_fail", count=2)
        ans = d.admin_call({"op": "load", "id": "l", "model": "m1"})
        assert ans.get("ok") and ans["state"] == "resident", ans
        assert_served(d, "m1")
        # a copy that keeps failing ends the load with an error instead of spinning
        cold(d, "m1")
        d.fault("copy_fail", count=1000)
        ans = d.admin_call({"op": "load", "id": "l2", "model": "m1"})
        assert_error(ans, "internal", "failed to copy")
        d.fault("off")
        assert_served(d, "m1", "after")
    finally:
        assert d.stop() == 0


def test_a_slow_copy_only_delays_and_the_daemon_keeps_answering():
    d = FaultDaemon(MODELS, memory=POOL, copy_timeout="10s")
    try:
        assert_served(d, "m0")
        cold(d, "m1")
        d.fault("copy_slow", count=1, delay_ms=1500)
        box = {}

        def slow():
            t0 = time.time()
            box["ans"] = gen(d, "m1", "slow")
            box["s"] = time.time() - t0

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.3)
        # while the worker waits on the copy, the loop answers at once: a bad line gets its error,
        # a new connection is accepted, and requests for other models are queued, not lost
        c = d.client()
        t0 = time.time()
        c.send_raw(b"{not json\n")
        assert c.recv()["error"]["code"] == "bad_json"
        assert time.time() - t0 < 1.0
        c.send({"op": "generate", "id": "q", "model": "m0", "prompt": PROMPT, "max_tokens": N,
                "temperature": 0})
        t.join(30)
        assert not t.is_alive()
        ans, _ = c.final("q")
        c.close()
        assert ans["event"] == "done" and ans["text"] == WANT["m0"], ans
        assert box["ans"]["event"] == "done" and box["ans"]["text"] == WANT["m1"], box
        assert box["s"] >= 1.4, box
    finally:
        assert d.stop() == 0


def test_a_planted_worker_stall_only_delays_the_passes_it_hits():
    """The "stall" fault (what the latency tests plant to show they catch a stall): the worker sleeps
    before each of its next count passes; the answers stay right, and then it runs as before."""
    d = FaultDaemon(MODELS, memory=POOL)
    try:
        assert_served(d, "m0")
        d.fault("stall", count=2, delay_ms=300)
        t0 = time.monotonic()
        assert_served(d, "m0", "stalled")
        assert time.monotonic() - t0 >= 0.6, "two passes, each 300 ms late"
        assert "fault injection: stall, next 2 operations, delay 300 ms" in d.logtext()
        d.fault("stall", count=5, delay_ms=300)
        d.fault("off")  # clears it
        wait = gsd.RunWait(d)
        s = gsd.Stream(d, "m0", N, "after")
        s.wait()
        # the gaps less the worker's wait for a CPU (a loaded host's share), none a stall
        own = wait.own(s.gaps())
        wait.close()
        assert all(g < 0.3 for g, _ in own), own
    finally:
        assert d.stop() == 0


def test_a_copy_past_the_timeout_fails_its_request_then_the_model_serves():
    d = FaultDaemon(MODELS, memory=POOL, copy_timeout="500ms")
    try:
        assert_served(d, "m0")
        cold(d, "m1")
        d.fault("copy_slow", count=1, delay_ms=2500)
        t0 = time.time()
        ans = gen(d, "m1", "late")
        took = time.time() - t0
        assert_error(ans, "internal", "did not complete within 0.5 s")
        assert took < 2.4, took                  # it did not wait for the copy
        assert_served(d, "m0", "other")
        time.sleep(2.5)                          # the slow copy lands on its own
        assert_served(d, "m1", "again")
        assert d.stats()["models"]["m1"]["total_device_errors"] == 1
    finally:
        assert d.stop() == 0


def test_model_files_corrupted_or_deleted_around_a_reload():
    tmp = gsd.tmpdir(prefix="gsd-files-")
    paths = {}
    for name, path, _ in MODELS:
        paths[name] = os.path.join(tmp, name + ".gguf")
        shutil.copy(path, paths[name])
    models = [(n, paths[n], "") for n in ("m0", "m1")]
    d = gsd.Daemon(models, memory=POOL)
    try:
        assert_served(d, "m0")
        assert_served(d, "m1")
        # files of loaded models: truncated, overwritten in place, deleted. The daemon holds them in RAM
        # and reads nothing from the file after loading: it serves on, correctly
        with open(paths["m0"], "r+b") as f:
            f.seek(64)
            f.write(b"\xff" * 4096)
        os.truncate(paths["m1"], 100)
        cold(d, "m0")
        cold(d, "m1")
        assert_served(d, "m0", "after-corrupt")
        assert_served(d, "m1", "after-truncate")
        os.unlink(paths["m0"])
        # a reload adding a model whose file is corrupt, and one whose file is gone
        with open(paths["m2"], "r+b") as f:
            f.seek(8)
            f.write(b"\xff\xff\xff\xff\xff\xff\xff\x7f")  # absurd tensor count
        missing = os.path.join(tmp, "gone.gguf")
        d.write_config(models + [("m2", paths["m2"], ""), ("gone", missing, "")], memory=POOL)
        ans = d.admin_call({"op": "reload", "id": "r"})
        assert ans.get("ok") and set(ans["added"]) == {"m2", "gone"}, ans
        for name, words in (("m2", "failed to load"), ("gone", "failed to load")):
            deadline = time.time() + 10
            while True:
                ans = gen(d, name, "x")
                if ans.get("event") == "error" or time.time() > deadline:
                    break
                time.sleep(0.05)
            assert_error(ans, "unknown_model", words)
        listed = {m["name"]: m for m in d.admin_call({"op": "models", "id": "m"})["models"]}
        assert "error" in listed["m2"] and "error" in listed["gone"], listed
        assert_served(d, "m0", "still")
        assert_served(d, "m1", "still")
        # the files are fixed: the next reload loads them
        shutil.copy(MODELS[2][1], paths["m2"])
        shutil.copy(MODELS[2][1], missing)
        ans = d.admin_call({"op": "reload", "id": "r2"})
        assert ans.get("ok"), ans
        deadline = time.time() + 10
        while True:
            ans = gen(d, "m2", "y")
            if ans.get("event") == "done" or time.time() > deadline:
                break
            time.sleep(0.05)
        assert ans.get("event") == "done" and ans["text"] == WANT["m2"], ans
        ans = gen(d, "gone", "z")
        assert ans.get("event") == "done" and ans["text"] == WANT["m2"], ans
    finally:
        assert d.stop() == 0


def start(config, log):
    return subprocess.Popen([gsd.GPUSWAPD, "--config", config], stdout=log, stderr=subprocess.STDOUT)


def wait_sockets(d, p):
    """Waits until the daemon process p (on d's config) has made both sockets."""
    deadline = time.time() + 30
    while not (os.path.exists(d.sock) and os.path.exists(d.admin)):
        assert p.poll() is None and time.time() < deadline, "did not start"
        time.sleep(0.02)


def test_socket_paths_already_taken_at_start():
    d = gsd.Daemon(MODELS[:1], memory=POOL)
    try:
        # a second daemon on the same admin socket path: refused with a clear error, the first untouched
        other = gsd.tmpdir(prefix="gsd-second-")
        cfg = os.path.join(other, "c.yaml")
        text = open(d.config).read().replace(d.sock, os.path.join(other, "s.sock"))
        with open(cfg, "w") as f:
            f.write(text)
        p = subprocess.run([gsd.GPUSWAPD, "--config", cfg], capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, p
        assert "in use by a running process" in p.stderr and d.admin in p.stderr, p.stderr
        assert d.stats()["models"]["m0"] is not None          # the first still answers on its admin socket
        assert_served(d, "m0")
        # a path that is not a socket is never replaced
        plain = os.path.join(other, "a.sock")
        with open(plain, "w") as f:
            f.write("keep me\n")
        with open(cfg, "w") as f:
            f.write(text.replace(d.admin, plain))
        p = subprocess.run([gsd.GPUSWAPD, "--config", cfg], capture_output=True, text=True, timeout=30)
        assert p.returncode != 0 and "is not a socket" in p.stderr, p
        assert open(plain).read() == "keep me\n"
    finally:
        assert d.stop() == 0


def test_logs_on_a_full_disk_do_not_stop_the_daemon():
    tmp = gsd.tmpdir(prefix="gsd-full-")
    d = gsd.Daemon(MODELS[:2], memory=POOL, tmp=tmp)  # only to write the config; stopped at once
    assert d.stop() == 0
    with open("/dev/full", "w") as full:                # every write fails with ENOSPC
        p = start(d.config, full)
        try:
            wait_sockets(d, p)
            for i in range(3):
                assert_served(d, "m%d" % (i % 2), "full%d" % i)
            c = d.client()
            assert c.call({"op": "generate", "id": "u", "model": "nope", "prompt": "x"})["error"]["code"] == \
                "unknown_model"
            c.close()
            p.send_signal(signal.SIGHUP)                # a reload logs too
            time.sleep(0.3)
            assert_served(d, "m1", "after-hup")
            p.send_signal(signal.SIGTERM)
            assert p.wait(30) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sigkill_and_restart_serves_again():
    d = gsd.Daemon(MODELS[:2], memory=POOL)
    c = d.client()
    c.send({"op": "generate", "id": "s", "model": "m0", "prompt": PROMPT, "max_tokens": 1000,
            "temperature": 0, "stream": True})
    ev = c.recv()
    assert ev["event"] == "token", ev
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    try:                                               # the client sees the connection end, not a hang
        while True:
            c.recv()
    except (EOFError, ConnectionResetError):
        pass
    c.close()
    assert os.path.exists(d.sock) and os.path.exists(d.admin)   # stale sockets left behind
    log = open(os.path.join(d.tmp, "log2"), "w")
    p = start(d.config, log)
    try:
        deadline = time.time() + 30
        while True:                                    # the stale sockets are replaced
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(d.admin)
                s.close()
                break
            except OSError:
                assert p.poll() is None, open(os.path.join(d.tmp, "log2")).read()
                assert time.time() < deadline
                time.sleep(0.05)
        assert_served(d, "m0", "restarted")
        assert_served(d, "m1", "restarted")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()
    d.log.close()


def test_a_stuck_worker_withholds_the_watchdog_and_pings_resume_after():
    tmp = gsd.tmpdir(prefix="gsd-wd-")
    d = FaultDaemon(MODELS, memory=POOL, copy_timeout="300ms", tmp=tmp)
    assert d.stop() == 0                               # only to write the config
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(os.path.join(tmp, "notify.sock"))
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify.sock"), WATCHDOG_USEC="200000")
    for k in ("WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
        env.pop(k, None)
    log = open(os.path.join(tmp, "log2"), "w")
    p = subprocess.Popen([gsd.GPUSWAPD, "--config", d.config], env=env, stdout=log, stderr=subprocess.STDOUT)
    pings = []
    stop = threading.Event()

    def listen():
        ns.settimeout(0.1)
        while not stop.is_set():
            try:
                msg = ns.recv(4096).decode()
            except socket.timeout:
                continue
            if "WATCHDOG=1" in msg.split("\n"):
                pings.append(time.time())

    t = threading.Thread(target=listen)
    t.start()
    try:
        wait_sockets(d, p)
        assert_served(d, "m0")
        cold(d, "m1")
        # a copy that takes 3 s: the pass gives up after 0.3 s, then evicting the model must wait for the copy
        # to land (its pages cannot be reused under it): the worker is stuck there for ~2.7 s
        d.fault("copy_slow", count=1, delay_ms=3000)
        assert_error(gen(d, "m1", "late"), "internal", "did not complete")
        t0 = time.time()
        ans = d.admin_call({"op": "evict", "id": "e", "model": "m1"})
        stuck = time.time() - t0
        assert ans.get("ok"), ans
        assert stuck > 1.5, stuck
        time.sleep(0.6)
        assert_served(d, "m0", "after")
        during = [x for x in pings if t0 + 0.8 < x < t0 + stuck - 0.1]
        after = [x for x in pings if x > t0 + stuck]
        assert not during, "pinged while the worker was stuck: %r" % [x - t0 for x in during]
        assert after, "no ping after the worker recovered"
        assert len([x for x in pings if x < t0]) >= 2, "no pings before the stall"
        assert "withholding the watchdog ping" in open(os.path.join(tmp, "log2")).read()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        stop.set()
        t.join()
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_fault_injection_is_refused_unless_configured,
               test_a_failed_copy_fails_only_its_requests_and_the_model_pages_in_again,
               test_a_failed_map_evicts_idle_models_and_is_retried_within_a_lowered_budget,
               test_a_persistent_map_failure_evicts_retries_answers_overloaded_and_never_wedges,
               test_a_failing_copy_during_an_admin_load_is_retried,
               test_a_slow_copy_only_delays_and_the_daemon_keeps_answering,
               test_a_planted_worker_stall_only_delays_the_passes_it_hits,
               test_a_copy_past_the_timeout_fails_its_request_then_the_model_serves,
               test_model_files_corrupted_or_deleted_around_a_reload,
               test_socket_paths_already_taken_at_start,
               test_logs_on_a_full_disk_do_not_stop_the_daemon,
               test_sigkill_and_restart_serves_again,
               test_a_stuck_worker_withholds_the_watchdog_and_pings_resume_after]:
        r.run(fn)
    sys.exit(r.exit_code())
