"""A model's `loading` state (real daemon, sim backend with device.sim_load_bandwidth): while a reload reads a new model into host RAM, `gpuswap models` (text and --json) and the socket's models op list it as loading, the other models keep their states, and it becomes `host` once loaded."""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-loading-")
SMALL = "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --seed 1"
# about 1.3 MiB of weights: some seconds at 256 KiB/s
BIG = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400 --seed 2"
M0 = ("m0", gsd.mkmodel(os.path.join(TMP, "m0.gguf"), SMALL), "")
M1 = ("m1", gsd.mkmodel(os.path.join(TMP, "m1.gguf"), BIG), "")
GPUSWAP = os.path.join(gsd.BUILD, "gpuswap")


class SlowLoadDaemon(gsd.Daemon):
    def write_config(self, models, memory="2MiB", page="64KiB", extra="", scheduler=""):
        super().write_config(models, memory, page, extra, scheduler)
        with open(self.config) as f:
            text = f.read()
        with open(self.config, "w") as f:
            f.write(text.replace("  threads: 1\n", "  threads: 1\n  sim_load_bandwidth: 256KiB\n", 1))


def gs(d, *args):
    out = subprocess.run([GPUSWAP, "--socket", d.sock, "--admin-socket", d.admin] + list(args),
                         capture_output=True, text=True, timeout=gsd.scaled(30))
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def states(d):
    return {m["name"]: m["state"] for m in json.loads(gs(d, "models", "--json"))["models"]}


def a_model_being_loaded_is_listed_as_loading_then_host():
    d = SlowLoadDaemon([M0], memory="8MiB")
    try:
        assert states(d) == {"m0": "host"}, states(d)
        d.write_config([M0, M1], memory="8MiB")
        t0 = time.time()
        d.signal(signal.SIGHUP)
        seen, text = None, ""
        deadline = time.time() + gsd.scaled(20)
        while time.time() < deadline:
            st = states(d)
            if st.get("m1") == "loading":
                seen = st
                text = gs(d, "models")
                break
            time.sleep(0.05)
        assert seen, "m1 never listed as loading"
        assert seen["m0"] == "host", seen
        line = [l for l in text.splitlines() if l.split()[:1] == ["m1"]]
        assert line and "loading" in line[0], text
        # the socket op itself says the same
        c = d.client()
        ev = c.call({"op": "models", "id": 1})
        c.close()
        names = {m["name"]: m["state"] for m in ev["models"]}
        assert names.get("m1") in ("loading", "host"), ev
        while time.time() < deadline and states(d).get("m1") != "host":
            time.sleep(0.1)
        took = time.time() - t0
        assert states(d) == {"m0": "host", "m1": "host"}, states(d)
        print("   m1 loaded in %.1f s (1.3 MiB at 256 KiB/s)" % took)
        # and it serves
        ev = d.client().call({"op": "generate", "id": 2, "model": "m1", "prompt": "hi", "max_tokens": 2})
        assert ev["event"] == "done", ev
    finally:
        assert d.stop() == 0


def main():
    r = gsd.Runner()
    r.run(a_model_being_loaded_is_listed_as_loading_then_host)
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
