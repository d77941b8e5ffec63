"""The daemon's log (real daemon, sim backend): log.level filters lines, a reload changes it, and under systemd (JOURNAL_STREAM naming stderr) every line starts with its syslog priority."""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-log-")
SHAPE = "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --seed 3"
MODELS = [("m0", gsd.mkmodel(os.path.join(TMP, "m0.gguf"), SHAPE), "")]


def wait_for(d, pattern, timeout=20):
    deadline = time.time() + gsd.scaled(timeout)
    while time.time() < deadline:
        if re.search(pattern, d.logtext(), re.M):
            return
        time.sleep(0.05)
    raise AssertionError("log lacks %r:\n%s" % (pattern, d.logtext()))


def info_lines_by_default_and_none_at_warning():
    d = gsd.Daemon(MODELS)
    try:
        wait_for(d, r"^gpuswapd: serving on ")
        assert re.search(r"^gpuswapd: loading model 'm0'", d.logtext(), re.M), d.logtext()
    finally:
        assert d.stop() == 0
    d = gsd.Daemon(MODELS, extra="log:\n  level: warning\n")
    try:
        ev = d.client().call({"op": "generate", "id": 1, "model": "m0", "prompt": "hi", "max_tokens": 2})
        assert ev["event"] == "done", ev
        text = d.logtext()
        assert "loading model" not in text and "serving on" not in text, text
        # a reload to debug brings the info lines back (log.level is reloadable)
        with open(d.config) as f:
            cfg = f.read()
        with open(d.config, "w") as f:
            f.write(cfg.replace("level: warning", "level: debug"))
        d.signal(signal.SIGHUP)
        wait_for(d, r"^gpuswapd: reloaded ")
    finally:
        assert d.stop() == 0


def journal_stream_on_stderr_gives_priority_prefixes():
    tmp = gsd.tmpdir(prefix="gsd-log-journal-")
    log = os.path.join(tmp, "log")
    open(log, "w").close()  # gsd.Daemon reopens it with "w": same inode
    st = os.stat(log)
    os.environ["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
    try:
        d = gsd.Daemon(MODELS, tmp=tmp)
    finally:
        del os.environ["JOURNAL_STREAM"]
    try:
        wait_for(d, r"^<5>gpuswapd: serving on ")
        text = d.logtext()
        assert re.search(r"^<6>gpuswapd: loading model 'm0'", text, re.M), text
        lines = [l for l in text.splitlines() if l.startswith("gpuswapd:") or l.startswith("<")]
        assert lines and all(re.match(r"<[3-7]>gpuswapd: ", l) for l in lines), text
    finally:
        assert d.stop() == 0
    with open(log) as f:
        text = f.read()
    assert re.search(r"^<5>gpuswapd: draining", text, re.M), text


def a_bad_level_stops_startup_naming_the_choices():
    cfg = os.path.join(TMP, "bad.yaml")
    with open(cfg, "w") as f:
        f.write("device:\n  backend: sim\nlog:\n  level: loud\nmodels:\n  - name: x\n    path: %s\n"
                % MODELS[0][1])
    import subprocess
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True)
    assert out.returncode != 0 and "log.level" in out.stderr and "debug" in out.stderr, out


def main():
    r = gsd.Runner()
    for fn in (info_lines_by_default_and_none_at_warning,
               journal_stream_on_stderr_gives_priority_prefixes,
               a_bad_level_stops_startup_naming_the_choices):
        r.run(fn)
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
