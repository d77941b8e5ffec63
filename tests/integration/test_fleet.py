"""A fleet on loopback: 3 gpuswapd daemons (sim backend), 12 models with 2 replicas each, placed and routed by `gpuswap fleet render`'s configs through HAProxy; Zipf traffic from concurrent clients: exact greedy answers, page-ins against round-robin over 3 hosts holding all 12 models, a body over 16 KiB routed by its model, kill -9 of a daemon mid-run (retries, cut answers, rejoin after /ready) and a rolling restart that loses nothing."""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

GPUSWAP = os.path.abspath(os.path.join(gsd.BUILD, "gpuswap"))
TMP = gsd.tmpdir(prefix="gsd-fleet-")
# about 1.3 ms a token on one core: greedy answers of a few hundred tokens take a
# good part of a second, long enough to kill a daemon in the middle of one
SHAPE = "--type q8_0 --dim 256 --layers 8 --heads 4 --kv-heads 2 --ff 768 --vocab 2000"
N_MODELS, HOSTS, REPLICAS = 12, 3, 2
POOL = "68MiB"          # device pool of every host: about 8 of the 12 models
PROMPT = "Once upon a time"
LONG_PROMPTS = ["Once upon a time", "hello world", "The cat", "In a land far away"]
N_TOKENS = 8
ZIPF_S = 0.9
N_REQUESTS = 360        # the Zipf trace run through both fleets
CLIENTS = 6
STATS_LOCK = threading.Lock()



def zipf_weights(n, s=ZIPF_S):
    return [1.0 / (k + 1) ** s for k in range(n)]


# ------------------------------------------------------------------ processes

class Host:
    """One gpuswapd started on a config file; HTTP on port, admin socket in run_dir."""

    def __init__(self, name, config, port, run_dir):
        self.name, self.config, self.port, self.run_dir = name, config, port, run_dir
        self.proc, self.log = None, None

    def start(self):
        self.log = open(os.path.join(self.run_dir, "log"), "a")
        self.proc = subprocess.Popen([gsd.GPUSWAPD, "--config", self.config], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        PROCS.append(self.proc)
        return self

    def ready(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/ready")
            r = c.getresponse()
            r.read()
            c.close()
            return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout=30):
        deadline = time.time() + gsd.scaled(timeout)
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("%s exited %s:\n%s" % (self.name, self.proc.returncode, self.logtext()))
            if self.ready():
                return
            time.sleep(0.05)
        raise AssertionError("%s not ready:\n%s" % (self.name, self.logtext()))

    def admin(self, obj):
        c = gsd.Client(os.path.join(self.run_dir, "admin.sock"))
        try:
            return c.call(obj)
        finally:
            c.close()

    def stats(self):
        return self.admin({"op": "stats", "id": "s"})["models"]

    def page_ins(self):
        return sum(m["total_page_ins"] for m in self.stats().values())

    def requests(self, model):
        m = self.stats().get(model)
        return m["total_requests"] if m else 0

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(gsd.scaled(30))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()
            self.log = None
        return self.proc.returncode if self.proc else None

    def logtext(self):
        try:
            return open(os.path.join(self.run_dir, "log")).read()[-3000:]
        except OSError:
            return ""


PROCS = []  # every process started here, killed at exit if still running


def _kill_all():
    for p in PROCS:
        if p.poll() is None:
            p.kill()
            p.wait()


class HAProxy:
    """haproxy -db on cfg; with FLEET_DEBUG=FILE it logs every request and check to FILE."""

    def __init__(self, cfg, port):
        self.port = port
        if os.environ.get("FLEET_DEBUG"):
            t = open(cfg).read().replace("global\n", "global\n    log stderr format raw local0\n", 1)
            t = t.replace("defaults\n", "defaults\n    log global\n    option httplog\n", 1)
            cfg += ".debug"
            with open(cfg, "w") as f:
                f.write(t)
        self.log = open(os.environ["FLEET_DEBUG"] if os.environ.get("FLEET_DEBUG") else cfg + ".log", "a")
        self.proc = subprocess.Popen([gsd.haproxy_path(), "-f", cfg, "-db"], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        PROCS.append(self.proc)
        deadline = time.time() + gsd.scaled(10)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("haproxy did not start: " + open(cfg + ".log").read())
                time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(gsd.scaled(10))
        self.log.close()


# ------------------------------------------------------------------ requests

def request(port, model, prompt, n, stream=False, timeout=60, extra=None, raw=None, headers=None):
    """One completion through the proxy: dict(status, text, done, error). done: the answer
    is complete (a JSON answer, or an event stream ending in [DONE])."""
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream}
    if extra:
        body = dict(extra, **body)  # padding first: the model comes last in the body
    data = raw if raw is not None else json.dumps(body).encode()
    out = {"status": None, "text": "", "done": False, "error": None, "t_sent": time.time()}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=gsd.scaled(timeout))
    try:
        c.request("POST", "/v1/completions", body=data,
                  headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        r = c.getresponse()
        out["status"] = r.status
        if r.status != 200 or not stream:
            payload = r.read()
            if r.status == 200:
                a = json.loads(payload)
                out["text"], out["done"] = a["choices"][0]["text"], True
            else:
                out["error"] = payload[:300]
            return out
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                out["done"] = True
                break
            ev = json.loads(line[6:])
            if ev.get("choices"):
                out["text"] += ev["choices"][0].get("text") or ""
            if ev.get("error"):
                out["error"] = ev["error"]
    except (http.client.HTTPException, OSError, ValueError) as e:
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        c.close()
    return out


def run_trace(port, trace, clients=CLIENTS, deadline_s=120):
    """Runs every (model, stream) of trace from `clients` threads; results in trace order."""
    results = [None] * len(trace)
    nxt = iter(range(len(trace)))
    lock = threading.Lock()
    stop_at = time.time() + gsd.scaled(deadline_s)

    def worker():
        while time.time() < stop_at:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            model, stream = trace[i]
            results[i] = request(port, model, PROMPT, N_TOKENS, stream=stream)

    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def check_answers(trace, results, refs, what):
    for (model, stream), r in zip(trace, results):
        assert r is not None, "%s: a request was never sent" % what
        assert r["status"] == 200 and r["done"] and not r["error"], (what, model, stream, r)
        assert r["text"] == refs[model], (what, model, r["text"], refs[model])


def zipf_trace(models, n, seed):
    rng = random.Random(seed)
    w = zipf_weights(len(models))
    return [(rng.choices(models, w)[0], rng.random() < 0.25) for _ in range(n)]


# ------------------------------------------------------------------ the fleet

class Fleet:
    """The models, their reference answers, the rendered fleet and (re)started processes."""

    def __init__(self):
        self.models = []
        for i in range(N_MODELS):
            path = gsd.mkmodel(os.path.join(TMP, "m%d.gguf" % i), SHAPE + " --seed %d" % (i + 11))
            self.models.append(("m%d" % i, path))
        self.refs = {name: gsd.generate_cli(path, PROMPT, N_TOKENS)["text"] for name, path in self.models}
        self.hosts = []

    def fleet_yaml(self, proxy_port, ports):
        lines = ["proxy:", "  listen: 127.0.0.1:%d" % proxy_port, "  addresses: [127.0.0.1]",
                 "  max_request: 64KiB", "  check_interval: 200ms", "  stream_timeout: 60s",
                 "defaults:", "  backend: sim", "  page_size: 256KiB", "  threads: 1",
                 "  drain_timeout: 30s", "hosts:"]
        for i, p in enumerate(ports):
            lines += ["  - name: h%d" % i, "    http: 127.0.0.1:%d" % p, "    device_memory: %s" % POOL,
                      "    host_memory: 1GiB", "    run_dir: %s" % os.path.join(TMP, "run-h%d" % i)]
        lines.append("models:")
        w = zipf_weights(N_MODELS)
        for (name, path), load in zip(self.models, w):
            lines += ["  - name: %s" % name, "    path: %s" % path,
                      "    size: %d" % os.path.getsize(path), "    replicas: %d" % REPLICAS,
                      "    load: %.6f" % load]
        path = os.path.join(TMP, "fleet.yaml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start_affinity(self):
        self.proxy_port = gsd.free_port()
        ports = [gsd.free_port() for _ in range(HOSTS)]
        fy = self.fleet_yaml(self.proxy_port, ports)
        self.out = os.path.join(TMP, "rendered")
        p = subprocess.run([GPUSWAP, "fleet", "render", fy, "--out", self.out], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        self.hosts = []
        for i, port in enumerate(ports):
            run = os.path.join(TMP, "run-h%d" % i)
            os.makedirs(run, exist_ok=True)
            self.hosts.append(Host("h%d" % i, os.path.join(self.out, "hosts", "h%d" % i, "gpuswapd.yaml"),
                                   port, run).start())
        for h in self.hosts:
            h.wait_ready()
        self.placed = {}
        for i in range(HOSTS):
            text = open(os.path.join(self.out, "hosts", "h%d" % i, "gpuswapd.yaml")).read()
            for name, _ in self.models:
                if re.search(r"^ *- name: %s$" % re.escape(name), text, re.M):
                    self.placed.setdefault(name, []).append(self.hosts[i])
        assert all(len(v) == REPLICAS for v in self.placed.values()) and len(self.placed) == N_MODELS
        self.haproxy = HAProxy(os.path.join(self.out, "haproxy.cfg"), self.proxy_port)

    def start_round_robin(self):
        """The same 3 hosts' pools, each configured with all 12 models, round-robin."""
        self.rr_port = gsd.free_port()
        self.rr_hosts = []
        for i in range(HOSTS):
            port = gsd.free_port()
            run = os.path.join(TMP, "rr-h%d" % i)
            os.makedirs(run, exist_ok=True)
            text = open(os.path.join(self.out, "hosts", "h%d" % i, "gpuswapd.yaml")).read()
            text = text.split("\nmodels:\n")[0] + "\nmodels:\n" + "".join(
                "  - name: %s\n    path: %s\n" % m for m in self.models)
            text = text.replace(os.path.join(TMP, "run-h%d" % i), run)
            text = text.replace("http: 127.0.0.1:%d" % self.hosts[i].port, "http: 127.0.0.1:%d" % port)
            cfg = os.path.join(run, "gpuswapd.yaml")
            with open(cfg, "w") as f:
                f.write(text)
            self.rr_hosts.append(Host("rr%d" % i, cfg, port, run).start())
        for h in self.rr_hosts:
            h.wait_ready()
        ha = open(os.path.join(self.out, "haproxy.cfg")).read().split("\nfrontend ")[0]
        ha += "\nfrontend rr\n    bind 127.0.0.1:%d\n    default_backend all\n\nbackend all\n" \
              "    balance roundrobin\n" % self.rr_port
        ha += "".join("    server %s 127.0.0.1:%d\n" % (h.name, h.port) for h in self.rr_hosts)
        cfg = os.path.join(TMP, "haproxy-rr.cfg")
        with open(cfg, "w") as f:
            f.write(ha)
        self.rr_haproxy = HAProxy(cfg, self.rr_port)

    def primary(self, model):
        """The replica the proxy sends model to when nothing else runs."""
        before = {h.name: h.requests(model) for h in self.placed[model]}
        r = request(self.proxy_port, model, PROMPT, N_TOKENS)
        assert r["status"] == 200 and r["text"] == self.refs[model], r
        got = [h for h in self.placed[model] if h.requests(model) > before[h.name]]
        assert len(got) == 1, got
        return got[0]

    def stop_all(self):
        """Stops everything; {host: exit status} of the daemons still running (SIGTERM: 0)."""
        rcs = {}
        for h in self.hosts + getattr(self, "rr_hosts", []):
            if h.proc and h.proc.poll() is None:
                rcs[h.name] = h.stop()
            else:
                h.stop()
        for hp in (getattr(self, "haproxy", None), getattr(self, "rr_haproxy", None)):
            if hp:
                hp.stop()
        return rcs


# ------------------------------------------------------------------ the test

RESULTS = {}


def long_prompt(path):
    """A prompt whose greedy answer runs long (600 tokens or more, most of a second) on this
    model, or None."""
    for p in LONG_PROMPTS:
        g = gsd.generate_cli(path, p, 600)
        n = len(g["ids"])
        if n >= 600 or g.get("finish_reason") == "length":
            return p, n
    return None


def load_refusal_goes_elsewhere(fl):
    """A replica that refuses a request for load (503 overloaded: its queue cannot give the first
    token within X-Deadline-Ms) is not marked down: the proxy retries the request on the other
    replica, which answers it, and keeps the refusing host in rotation."""
    model, path = next((m, p) for m, p in fl.models if long_prompt(p))
    busy = fl.primary(model)
    other = next(h for h in fl.placed[model] if h is not busy)
    lp, _ = long_prompt(path)
    # a backlog on the primary, sent to it directly: long answers, far more than a batch
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(busy.run_dir, "gpuswapd.sock"))
    for i in range(64):
        s.sendall((json.dumps({"op": "generate", "id": i, "model": model, "prompt": lp,
                               "max_tokens": 1500, "temperature": 0}) + "\n").encode())
    try:
        gsd.until(lambda: busy.stats()[model]["total_requests"] >= 64, 10)
        time.sleep(gsd.scaled(0.5))  # its admissions go on: the gap per request ahead is measured
        log = open(fl.haproxy.log.name).read() if os.path.exists(fl.haproxy.log.name) else ""
        st0 = busy.stats()[model]
        refused0 = st0["total_deadline_refused"] + st0["total_deadline_dropped"]
        served0 = other.requests(model)
        r = request(fl.proxy_port, model, PROMPT, N_TOKENS, headers={"X-Deadline-Ms": "300"})
        assert r["status"] == 200 and r["text"] == fl.refs[model], r
        st = busy.stats()[model]
        refused = st["total_deadline_refused"] + st["total_deadline_dropped"] - refused0
        assert refused >= 1, ("the busy replica refused nothing", st)
        assert other.requests(model) == served0 + 1, (other.requests(model), served0)
        fl.haproxy.log.flush()
        after = open(fl.haproxy.log.name).read()[len(log):]
        assert "%s is DOWN" % busy.name not in after, after
    finally:
        s.close()  # the backlog is cancelled with its connection
    RESULTS["load refusal"] = ("%s refused a request it could not start within 300 ms (%d ahead): "
                               "%s answered it, %s stayed up" % (busy.name, 64, other.name, busy.name))


def kill_mid_run(fl):
    """kill -9 of the host serving a long stream and a long non-streaming answer, with Zipf
    traffic around them; then restart it and see it serve again once /ready."""
    # the victim: the host that is primary for most models, two of them with long answers
    prim = {name: fl.primary(name) for name, _ in fl.models}
    by_host = {}
    for name, h in prim.items():
        by_host.setdefault(h.name, []).append(name)
    victim_name = max(sorted(by_host), key=lambda k: len(by_host[k]))
    victim = next(h for h in fl.hosts if h.name == victim_name)
    paths = dict(fl.models)
    longs = []
    for name in by_host[victim_name]:
        lp = long_prompt(paths[name])
        if lp:
            longs.append((name,) + lp)
        if len(longs) == 2:
            break
    assert longs, "no model of %s has a long greedy answer" % victim_name
    (m_stream, p_stream, n_stream), (m_plain, p_plain, n_plain) = longs[0], longs[-1]
    # the non-streaming one first, seen running on the victim, then the stream
    plain = {}
    before = victim.requests(m_plain)
    tp = threading.Thread(target=lambda: plain.update(request(fl.proxy_port, m_plain, p_plain, 1500)))
    tp.start()
    deadline = time.time() + gsd.scaled(10)
    while victim.requests(m_plain) == before and time.time() < deadline:
        time.sleep(0.01)
    assert victim.requests(m_plain) > before, "the long request did not reach %s" % victim_name
    c = http.client.HTTPConnection("127.0.0.1", fl.proxy_port, timeout=gsd.scaled(30))
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": m_stream, "prompt": p_stream, "max_tokens": 1500, "temperature": 0,
         "stream": True}).encode(), headers={"Content-Type": "application/json"})
    sr = c.getresponse()
    assert sr.status == 200
    first = sr.readline()
    assert first.startswith(b"data: "), first
    # Zipf traffic around it, then the kill
    trace = zipf_trace([m for m, _ in fl.models], 120, seed=3)
    bg = {}
    tb = threading.Thread(target=lambda: bg.update(r=run_trace(fl.proxy_port, trace, clients=4)))
    tb.start()
    time.sleep(0.2)
    victim.proc.kill()
    victim.proc.wait()
    t_kill = time.time()  # dead: whatever is sent from now on meets a closed port
    # the stream ends without [DONE]: the client sees the cut, never a hang
    t0 = time.time()
    rest, cut_by = b"", None
    try:
        rest = sr.read()
    except http.client.IncompleteRead as e:
        rest, cut_by = e.partial, "IncompleteRead"
    except (http.client.HTTPException, OSError) as e:
        cut_by = type(e).__name__
    c.close()
    assert b"data: [DONE]" not in first + rest, "the stream completed: the kill came too late"
    assert time.time() - t0 < gsd.scaled(10), "the cut stream hung"
    tp.join(gsd.scaled(60))
    tb.join(gsd.scaled(120))
    assert plain.get("status") and plain["status"] >= 500, plain
    res = bg["r"]
    after = [r for r in res if r and r["t_sent"] > t_kill]
    failed = [r for r in res if r and (r["status"] != 200 or not r["done"])]
    for r in after:
        assert r["status"] == 200 and r["done"], ("sent after the kill", r)
    for r in failed:
        # only what was on the victim when it died: sent before the kill, answered 5xx, or a
        # stream cut before its [DONE]
        assert r["t_sent"] <= t_kill and (r["status"] is None or r["status"] >= 500 or
                                          (r["status"] == 200 and not r["done"])), r
    for (model, _), r in zip(trace, res):
        if r and r["status"] == 200 and r["done"]:
            assert r["text"] == fl.refs[model], (model, r)
    # restart: it serves again once /ready says so
    victim.stop()
    victim.start()
    victim.wait_ready()
    time.sleep(gsd.scaled(1))  # a few health checks
    back = 0
    for name in by_host[victim_name]:
        before = victim.requests(name)
        r = request(fl.proxy_port, name, PROMPT, N_TOKENS)
        assert r["status"] == 200 and r["text"] == fl.refs[name], r
        back += victim.requests(name) > before
    assert back == len(by_host[victim_name]), "the restarted host did not take its models back"
    RESULTS["failover"] = ("kill -9 of %s (primary for %d models) with 120 Zipf requests around a "
                           "long stream (cut after %d bytes%s, no [DONE]) and a long answer "
                           "(status %s): %d requests sent after the kill all answered, %d in "
                           "flight answered 5xx or cut, the restarted host served its %d models again"
                           % (victim_name, len(by_host[victim_name]), len(first + rest),
                              ", " + cut_by if cut_by else "", plain["status"], len(after),
                              len(failed), back))


def rolling_restart(fl):
    """Drain, stop and start each host in turn under steady traffic: no request lost."""
    models = [m for m, _ in fl.models]
    stop = threading.Event()
    results, lock = [], threading.Lock()
    rng = random.Random(5)
    w = zipf_weights(len(models))

    def client():
        for _ in range(400):  # bounded; the restarts end it sooner
            if stop.is_set():
                return
            with lock:
                model, stream = rng.choices(models, w)[0], rng.random() < 0.25
            r = request(fl.proxy_port, model, PROMPT, N_TOKENS, stream=stream)
            with lock:
                results.append((model, r))

    ts = [threading.Thread(target=client) for _ in range(4)]
    for t in ts:
        t.start()
    try:
        for h in fl.hosts:
            time.sleep(0.3)
            a = h.admin({"op": "drain", "id": "d"})
            assert a.get("ok"), a
            assert h.proc.wait(gsd.scaled(30)) == 0
            h.stop()
            h.start()
            h.wait_ready()
            time.sleep(gsd.scaled(0.5))  # the proxy's checks see it up again
    finally:
        stop.set()
        for t in ts:
            t.join(gsd.scaled(120))
    assert len(results) > 20, len(results)
    for model, r in results:
        assert r["status"] == 200 and r["done"] and r["text"] == fl.refs[model], (model, r)
    RESULTS["rolling"] = "rolling restart of 3 hosts under 4 clients: %d requests, 0 lost" % len(results)


def big_body_routes_by_model(fl):
    model = fl.models[5][0]
    pad = "x" * (20 * 1024)
    body = ('{"user":"%s","prompt":"%s","max_tokens":%d,"temperature":0,"model":"%s"}'
            % (pad, PROMPT, N_TOKENS, model)).encode()
    assert len(body) > 16 * 1024
    before = {h.name: h.requests(model) for h in fl.hosts}
    r = request(fl.proxy_port, model, PROMPT, N_TOKENS, raw=body)
    assert r["status"] == 200 and r["text"] == fl.refs[model], r
    served = [h for h in fl.hosts if h.requests(model) > before[h.name]]
    assert len(served) == 1 and served[0] in fl.placed[model], (served, fl.placed[model])


def test_fleet_through_haproxy():
    t_start = time.time()
    assert gsd.haproxy_path(), "haproxy is missing: apt-get install haproxy (make deps)"
    fl = Fleet()
    try:
        fl.start_affinity()
        models = [m for m, _ in fl.models]
        trace = zipf_trace(models, N_REQUESTS, seed=1)
        before = sum(h.page_ins() for h in fl.hosts)
        res = run_trace(fl.proxy_port, trace)
        check_answers(trace, res, fl.refs, "affinity")
        pi_aff = sum(h.page_ins() for h in fl.hosts) - before
        big_body_routes_by_model(fl)
        load_refusal_goes_elsewhere(fl)
        kill_mid_run(fl)
        rolling_restart(fl)
        # round-robin over the same hosts and pools, every host with every model
        for h in fl.hosts:
            assert h.stop() == 0, (h.name, h.logtext())  # sanitizers report through the status
        fl.haproxy.stop()
        fl.start_round_robin()
        before = sum(h.page_ins() for h in fl.rr_hosts)
        res = run_trace(fl.rr_port, trace)
        check_answers(trace, res, fl.refs, "round-robin")
        pi_rr = sum(h.page_ins() for h in fl.rr_hosts) - before
        rcs = fl.stop_all()
        assert rcs and all(rc == 0 for rc in rcs.values()), rcs
    finally:
        fl.stop_all()
    ratio = pi_rr / max(pi_aff, 1)
    print("  page-ins (segments) for %d Zipf(%.1f) requests over %d models, %d clients: rendered "
          "affinity %d, round-robin %d: %.1fx fewer" % (N_REQUESTS, ZIPF_S, N_MODELS, CLIENTS,
                                                         pi_aff, pi_rr, ratio))
    for k in ("load refusal", "failover", "rolling"):
        print("  " + RESULTS[k])
    print("  whole test: %.0f s" % (time.time() - t_start))
    assert ratio >= 3, (pi_aff, pi_rr)


if __name__ == "__main__":
    import atexit
    atexit.register(_kill_all)
    r = gsd.Runner()
    r.run(test_fleet_through_haproxy)
    sys.exit(r.exit_code())
