"""Helpers for integration tests: generated models, a real gpuswapd daemon on the sim backend, socket clients."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

BUILD = os.environ.get("GPUSWAPD_BUILD", "build")
GPUSWAPD = os.path.join(BUILD, "gpuswapd")
MKMODEL = os.path.join(BUILD, "mkmodel")


def mkmodel(path, args):
    subprocess.run([MKMODEL, "--out", path] + args.split(), check=True, stdout=subprocess.DEVNULL)
    return path


class Client:
    """A JSON-lines client on a unix socket."""

    def __init__(self, path, timeout=30):
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
    """Starts gpuswapd on a generated config; stop() sends SIGTERM and returns the exit code."""

    def __init__(self, models, memory="2MiB", page="64KiB", extra="", scheduler="", tmp=None):
        self.tmp = tmp or tempfile.mkdtemp(prefix="gsd-")
        self.sock = os.path.join(self.tmp, "s.sock")
        self.admin = os.path.join(self.tmp, "a.sock")
        self.config = os.path.join(self.tmp, "gpuswapd.yaml")
        self.models = models
        self.write_config(models, memory, page, extra, scheduler)
        self.log_path = os.path.join(self.tmp, "log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([GPUSWAPD, "--config", self.config], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not (os.path.exists(self.sock) and os.path.exists(self.admin)):
            if self.proc.poll() is not None:
                raise RuntimeError("gpuswapd exited %d:\n%s" % (self.proc.returncode, self.logtext()))
            if time.time() > deadline:
                raise RuntimeError("gpuswapd did not start:\n" + self.logtext())
            time.sleep(0.02)

    def write_config(self, models, memory="2MiB", page="64KiB", extra="", scheduler=""):
        lines = ["listen:", "  socket: %s" % self.sock, "admin:", "  socket: %s" % self.admin,
                 "device:", "  backend: sim", "  memory: %s" % memory, "  page_size: %s" % page,
                 "  threads: 1"]
        if scheduler:
            lines += ["scheduler:"] + ["  " + l for l in scheduler.strip().splitlines()]
        lines.append("models:")
        for name, path, more in models:
            lines += ["  - name: %s" % name, "    path: %s" % path]
            lines += ["    " + l for l in more.strip().splitlines() if l.strip()]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n" + extra)

    def logtext(self):
        self.log.flush()
        return open(self.log_path).read()

    def client(self):
        return Client(self.sock)

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
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def generate_cli(model_path, prompt, n):
    """The one-shot engine: `gpuswapd generate` greedy ids and text."""
    out = subprocess.run([GPUSWAPD, "generate", "--model", model_path, "--prompt", prompt, "-n",
                          str(n), "--temp", "0", "--json", "--quiet", "--threads", "1"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
