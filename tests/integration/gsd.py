"""Helpers for integration tests: generated models, a real gpuswapd daemon on the sim backend, socket clients."""
import atexit
import bisect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

BUILD = os.environ.get("GPUSWAPD_BUILD", "build")
GPUSWAPD = os.path.abspath(os.path.join(BUILD, "gpuswapd"))
MKMODEL = os.path.abspath(os.path.join(BUILD, "mkmodel"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# GPUSWAPD_VALGRIND=1: every daemon a Daemon starts, and generate_cli, runs under
# valgrind's memcheck; an error or a definite leak fails the test (see Daemon.stop).
VALGRIND = os.environ.get("GPUSWAPD_VALGRIND") == "1"
# One factor for every timeout in these helpers (and for tests that want one):
# memcheck runs the daemon 20-50 times slower.
TIMEOUT_FACTOR = float(os.environ.get("GPUSWAPD_TIMEOUT_FACTOR") or (20 if VALGRIND else 1))
VALGRIND_SUPP = os.path.join(ROOT, "tests", "valgrind.supp")
# GPUSWAPD_CAGE=1: every daemon a Daemon starts runs under build/syscage, the systemd unit's
# MemoryDenyWriteExecute= and SystemCallFilter= (tests/tools/syscage.c).
CAGE = os.environ.get("GPUSWAPD_CAGE") == "1"


def free_port():
    """A TCP port on 127.0.0.1 nobody listens on now."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cage_prefix():
    return [os.path.abspath(os.path.join(BUILD, "syscage")),
            "--unit", os.path.join(ROOT, "systemd", "gpuswapd.service.in"),
            "--groups", os.path.join(ROOT, "tests", "data", "systemd-syscall-groups.txt"), "--"]
VG_BEGIN, VG_END = "==VGERROR-BEGIN==", "==VGERROR-END=="

_TMPDIRS = []  # every tmpdir() of this process, removed at exit


def haproxy_path():
    """Debian's haproxy (/usr/sbin, which a user's PATH may lack), or None."""
    found = shutil.which("haproxy")
    return found or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)


def tmpdir(prefix="gsd-"):
    """A fresh directory under $TMPDIR (the runner gives each suite its own and fails
    it when anything is left there), removed with its contents when the test exits."""
    d = tempfile.mkdtemp(prefix=prefix)
    _TMPDIRS.append(d)
    return d


def _cleanup_at_exit():
    """Runs last at exit: stops the daemons still running, then removes every tmpdir()."""
    for d in Daemon.started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
    for d in _TMPDIRS:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup_at_exit)  # registered first, so it runs after the valgrind check


def valgrind_prefix(log_path):
    """The valgrind command line that runs a program under memcheck, logging to log_path.
    --fair-sched: valgrind runs one thread at a time, and by default the worker's compute
    loop keeps the lock, so the event loop would not read a cancel or send a token until
    a whole generation is over."""
    cmd = ["valgrind", "--tool=memcheck", "--vgdb=no", "--fair-sched=yes", "--error-exitcode=99", "--leak-check=full",
           "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite", "--num-callers=40",
           "--error-markers=%s,%s" % (VG_BEGIN, VG_END), "--log-file=" + log_path]
    if os.path.exists(VALGRIND_SUPP):
        cmd.append("--suppressions=" + VALGRIND_SUPP)
    return cmd


def valgrind_report(log_path, rc):
    """The errors valgrind logged (each between the markers), or "" when clean. rc 99 is
    valgrind's own verdict; the markers also catch errors of a process that was killed
    before it could print its summary."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return ""
    errors = re.findall(re.escape(VG_BEGIN) + r"(.*?)" + re.escape(VG_END), text, re.S)
    if not errors and rc != 99:
        return ""
    summary = re.findall(r"ERROR SUMMARY: .*", text)
    return "valgrind (%s, exit %s): %d error(s), %s\n%s" % (
        log_path, rc, len(errors), summary[-1] if summary else "no summary (killed?)",
        "".join(errors)[:8000])


def scaled(seconds):
    """A timeout in seconds, stretched by TIMEOUT_FACTOR."""
    return seconds * TIMEOUT_FACTOR


def mkmodel(path, args):
    subprocess.run([MKMODEL, "--out", path] + args.split(), check=True, stdout=subprocess.DEVNULL)
    return path


class Client:
    """A JSON-lines client on a unix socket."""

    def __init__(self, path, timeout=30):
        timeout = scaled(timeout)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send(self, obj):
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def final(self, rid):
        """Reads until the final answer for rid; returns (final, token events)."""
        tokens = []
        while True:
            ev = self.recv()
            if ev.get("id") != rid:
                raise AssertionError("unexpected event for another id: %r" % ev)
            if ev.get("event") == "token":
                tokens.append(ev)
                continue
            return ev, tokens

    def call(self, obj):
        self.send(obj)
        return self.final(obj.get("id"))[0]

    def close(self):
        self.sock.close()


class Daemon:
    """Starts gpuswapd on a generated config; stop() sends SIGTERM and returns the exit code.
    Under GPUSWAPD_VALGRIND=1 it runs under memcheck and stop() raises on its errors."""

    started = []  # every Daemon of this process, for the valgrind check at exit

    def __init__(self, models, memory="2MiB", page="64KiB", extra="", scheduler="", tmp=None, listen="",
                 cwd=None):
        """listen: more lines for the listen section; cwd: the daemon's working directory, and
        then the config names its files relative to its own directory (as an operator may)."""
        self.tmp = tmp or tmpdir("gsd-")
        self.listen_more, self.relative = listen, cwd is not None
        self.sock = os.path.join(self.tmp, "s.sock")
        self.admin = os.path.join(self.tmp, "a.sock")
        self.config = os.path.join(self.tmp, "gpuswapd.yaml")
        self.models = models
        self.write_config(models, memory, page, extra, scheduler)
        self.log_path = os.path.join(self.tmp, "log")
        self.log = open(self.log_path, "w")
        self.vg_log = os.path.join(self.tmp, "valgrind.log") if VALGRIND else None
        self.vg_checked = False
        prefix = valgrind_prefix(self.vg_log) if VALGRIND else cage_prefix() if CAGE else []
        config = os.path.relpath(self.config, cwd) if cwd else self.config
        self.proc = subprocess.Popen(prefix + [GPUSWAPD, "--config", config], stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=cwd)
        Daemon.started.append(self)
        deadline = time.time() + scaled(30)
        # a socket file exists from bind() on, and answers once listen() ran: wait for both
        while not (self.accepts(self.sock) and self.accepts(self.admin)):
            if self.proc.poll() is not None:
                raise RuntimeError("gpuswapd exited %d:\n%s" % (self.proc.returncode, self.logtext()))
            if time.time() > deadline:
                raise RuntimeError("gpuswapd did not start:\n" + self.logtext())
            time.sleep(0.02)

    @staticmethod
    def accepts(path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def write_config(self, models, memory="2MiB", page="64KiB", extra="", scheduler=""):
        def at(p):  # as the config names a file: relative to its directory when self.relative
            return os.path.relpath(p, self.tmp) if self.relative else p
        lines = ["listen:", "  socket: %s" % at(self.sock)]
        lines += ["  " + l for l in self.listen_more.strip().splitlines() if l.strip()]
        lines += ["admin:", "  socket: %s" % at(self.admin),
                 "device:", "  backend: sim", "  memory: %s" % memory, "  page_size: %s" % page,
                 "  threads: 1"]
        if VALGRIND and "drain_timeout" not in scheduler:
            # the drain deadline is a timeout too: memcheck's daemon needs longer to finish
            scheduler = scheduler.strip() + "\ndrain_timeout: %ds" % scaled(30)
        if scheduler:
            lines += ["scheduler:"] + ["  " + l for l in scheduler.strip().splitlines()]
        lines.append("models:")
        for name, path, more in models:  # path None: an adapter (more names its file and base)
            lines += ["  - name: %s" % name] + (["    path: %s" % at(path)] if path else [])
            lines += ["    " + l for l in more.strip().splitlines() if l.strip()]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n" + extra)

    def logtext(self):
        self.log.flush()
        return open(self.log_path).read()

    def wait_log(self, text, timeout=10):
        """The log once it holds text (a line another thread writes a little
        later, such as the worker's after a reload), or as it is at the
        timeout (scaled for sanitizer builds)."""
        deadline = time.time() + scaled(timeout)
        while text not in self.logtext() and time.time() < deadline:
            time.sleep(0.02)
        return self.logtext()

    def client(self, timeout=30):
        return Client(self.sock, timeout)

    def admin_call(self, obj):
        c = Client(self.admin)
        try:
            return c.call(obj)
        finally:
            c.close()

    def stats(self):
        return self.admin_call({"op": "stats", "id": "stats"})

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(scaled(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.check_valgrind()
        return self.proc.returncode

    def check_valgrind(self):
        """Raises AssertionError with the report when memcheck found errors (once)."""
        if not self.vg_log or self.vg_checked or self.proc.poll() is None:
            return
        self.vg_checked = True
        report = valgrind_report(self.vg_log, self.proc.returncode)
        if report:
            raise AssertionError(report)


def _valgrind_at_exit():
    """Daemons a test stopped by itself (proc.wait, kill) or left running are checked
    here: a valgrind error fails the test script whatever its own verdict was."""
    bad = []
    for d in Daemon.started:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(scaled(30))
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
        try:
            d.check_valgrind()
        except AssertionError as e:
            bad.append(str(e))
    if bad:
        print("FAIL valgrind:\n" + "\n".join(bad), flush=True)
        os._exit(1)


if VALGRIND:
    atexit.register(_valgrind_at_exit)


def generate_cli(model_path, prompt, n):
    """The one-shot engine: `gpuswapd generate` greedy ids and text (under memcheck too
    with GPUSWAPD_VALGRIND=1: an error fails the call)."""
    prefix, log = [], None
    if VALGRIND:
        fd, log = tempfile.mkstemp(prefix="gsd-vg-generate-", suffix=".log")
        os.close(fd)
        prefix = valgrind_prefix(log)
    out = subprocess.run(prefix + [GPUSWAPD, "generate", "--model", model_path, "--prompt", prompt, "-n",
                          str(n), "--temp", "0", "--json", "--quiet", "--threads", "1"],
                         capture_output=True, text=True)
    if log:
        report = valgrind_report(log, out.returncode)
        if report:
            raise AssertionError("gpuswapd generate: " + report)
        os.unlink(log)
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, "gpuswapd generate", out.stdout, out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


class Stream:
    """One streaming generate on its own connection, read by a thread: token timestamps and the done."""

    def __init__(self, d, model, max_tokens, rid, timeout=30, tokens=(5, 6, 7, 8)):
        """timeout: seconds (scaled) the stream may go without an event, the wait for its first token
        too; tokens: the prompt."""
        self.c = d.client(timeout)
        self.rid = rid
        self.ts, self.done, self.other = [], None, []
        self.c.send({"op": "generate", "id": rid, "model": model, "tokens": list(tokens), "max_tokens": max_tokens,
                     "temperature": 0, "stream": True})
        self.t = threading.Thread(target=self.read)
        self.t.start()

    def read(self):
        while self.done is None:
            ev = self.c.recv()
            if ev.get("id") != self.rid:
                self.other.append(ev)
            elif ev.get("event") == "token":
                self.ts.append(ev["ts"])
            else:
                self.done = ev

    def cancel(self):
        self.c.send({"op": "cancel", "id": "x-" + self.rid, "target": self.rid})

    def wait(self, timeout=60):
        self.t.join(scaled(timeout))
        assert not self.t.is_alive(), "no answer for %s" % self.rid
        self.c.close()
        assert self.done.get("event") == "done", self.done
        return self.done

    def gaps(self):
        return [(b - a, b) for a, b in zip(self.ts, self.ts[1:])]


class RunWait:
    """The run-queue wait of a daemon's threads (run_delay in /proc/PID/task/TID/schedstat: time a
    thread was ready to run while other processes had the CPUs) and their CPU time, sampled every
    SAMPLE_S seconds by a thread of this process: the neighbours' share of a gap between two tokens.
    The threads: the worker (`gsd-worker`), which computes and stamps each token (`ts`,
    CLOCK_MONOTONIC as time.monotonic), and the sim backend's copy thread (`gsd-sim-copy`), whose
    copies a pass may wait for. What is left of a gap (compute, or the worker blocked) is the
    daemon's own: a timing test bounds that, so a loaded host does not fail it and a stall (the
    worker blocked, or computing what it should not) still does."""

    SAMPLE_S = 0.001
    WORKER = "gsd-worker"
    THREADS = (WORKER, "gsd-sim-copy")

    def __init__(self, d, threads=THREADS):
        self.names = tuple(threads)
        paths = {}
        deadline = time.time() + scaled(10)
        while len(paths) < len(threads):
            for tid in os.listdir("/proc/%d/task" % d.proc.pid):
                try:
                    with open("/proc/%d/task/%s/comm" % (d.proc.pid, tid)) as f:
                        name = f.read().strip()
                except OSError:
                    continue
                if name in threads:
                    paths[name] = "/proc/%d/task/%s/schedstat" % (d.proc.pid, tid)
            if len(paths) < len(threads):
                assert time.time() < deadline, "gpuswapd %d has threads %s, not all of %s" % (
                    d.proc.pid, sorted(paths), threads)
                time.sleep(0.01)
        self.paths = [paths[n] for n in self.names]
        # (monotonic s before the reads, after them, ((cpu s, run-queue wait s) of each thread))
        self.samples = []
        self.stopped = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        until(lambda: len(self.samples) >= 2, 10)

    def _run(self):
        while not self.stopped:
            t0 = time.monotonic()
            vals = []
            try:
                for path in self.paths:
                    with open(path) as f:
                        cpu, delay = f.read().split()[:2]
                    vals.append((int(cpu) / 1e9, int(delay) / 1e9))
            except OSError:  # the daemon exited
                return
            self.samples.append((t0, time.monotonic(), tuple(vals)))
            time.sleep(self.SAMPLE_S)

    def _span(self, s, t0, t1):
        """The samples bracketing [t0, t1]: the last read before t0, the first begun after t1."""
        before, after = [x[0] for x in s], [x[1] for x in s]
        return s[max(0, bisect.bisect_right(after, t0) - 1)], s[bisect.bisect_left(before, t1)]

    def _until(self, t):
        until(lambda: self.samples[-1][0] >= t, 10)
        return list(self.samples)

    def _waited(self, s, t0, t1, threads, lead=0.0):
        total = 0.0
        for n in threads or self.names:
            lo, hi = self._span(s, t0 - (lead if n != self.WORKER else 0.0), t1)
            i = self.names.index(n)
            total += max(0.0, hi[2][i][1] - lo[2][i][1])
        return total

    def waited(self, t0, t1, threads=None):
        """Seconds the threads (all, or those named) waited for a CPU between t0 and t1
        (monotonic), together, at most: from the last sample read before t0 to the first one begun
        after t1 (a thread's wait is counted when it runs, and the worker ran to stamp a token at t1)."""
        return self._waited(self._until(t1), t0, t1, threads)

    def cpu(self, t0, t1, thread=WORKER):
        """Seconds of CPU the thread had between t0 and t1 (monotonic), at most."""
        lo, hi = self._span(self._until(t1), t0, t1)
        i = self.names.index(thread)
        return hi[2][i][0] - lo[2][i][0]

    def own(self, gaps, threads=None, lead=0.0):
        """[(gap, end)] of a Stream's gaps, each less the threads' wait for a CPU inside it. lead:
        seconds before each gap from which the threads other than the worker count too (a copy the
        worker waits for in a gap may have been starved since it started, one copy's time before)."""
        if not gaps:
            return []
        s = self._until(max(end for _, end in gaps))
        return [(max(0.0, g - self._waited(s, end - g, end, threads, lead)), end) for g, end in gaps]

    def close(self):
        self.stopped = True
        self.t.join(5)


def until(cond, timeout):
    deadline = time.time() + scaled(timeout)
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


class Runner:
    """Runs test functions, prints one line each and a summary; exit code for run.sh."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, fn):
        t0 = time.time()
        try:
            fn()
            self.passed += 1
            print("ok   %s (%.1fs)" % (fn.__name__, time.time() - t0), flush=True)
        except Exception as e:  # report and go on
            import traceback
            self.failed += 1
            print("FAIL %s: %s" % (fn.__name__, e), flush=True)
            traceback.print_exc()

    def exit_code(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0
