"""Starting the daemon as an operator does: --check-config opens every model, config paths are
taken from the config's directory, and a burst of connections as large as the limit is all
answered."""
import errno
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-startup-")
SHAPE = "--type q8_0 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300 --ctx 512"
MODEL = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE + " --seed 3")


def check_config(text, name="gpuswapd.yaml"):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return subprocess.run([gsd.GPUSWAPD, "--check-config", path], capture_output=True, text=True,
                          timeout=gsd.scaled(30)), path


def config_with(models):
    lines = ["listen:", "  socket: %s/s.sock" % TMP, "device:", "  backend: sim", "  memory: 4MiB", "models:"]
    for name, path in models:
        lines += ["  - name: %s" % name, "    path: %s" % path]
    return "\n".join(lines) + "\n"


def test_check_config_fails_naming_a_missing_or_unsupported_model_file():
    junk = os.path.join(TMP, "junk.gguf")
    with open(junk, "wb") as f:
        f.write(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    out, path = check_config(config_with([("good", MODEL), ("gone", "missing.gguf"), ("junk", junk)]))
    assert out.returncode == 1, out
    lines = out.stderr.splitlines()
    gone = [l for l in lines if "'gone'" in l]
    assert gone and gone[0].startswith(path + ":9: ") and os.path.join(TMP, "missing.gguf") in gone[0] \
        and "No such file" in gone[0], out.stderr
    bad = [l for l in lines if "'junk'" in l]
    assert bad and bad[0].startswith(path + ":11: ") and junk in bad[0], out.stderr
    assert any("'good': llama Q8_0" in l for l in lines), out.stderr
    assert "name: \"gone\"" in out.stdout, "the effective config is printed all the same: %r" % out.stdout
    os.chmod(junk, 0)
    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        out, _ = check_config(config_with([("junk", junk)]), "unreadable.yaml")
        assert out.returncode == 1 and "Permission denied" in out.stderr, out
    os.unlink(junk)
    out, _ = check_config(config_with([("good", MODEL)]), "ok.yaml")
    assert out.returncode == 0 and "path: \"%s\"" % MODEL in out.stdout, out


def test_relative_paths_in_the_config_are_taken_from_its_directory():
    elsewhere = gsd.tmpdir(prefix="gsd-cwd-")
    d = gsd.Daemon([("m", MODEL, "max_context: 4096")], memory="4MiB", cwd=elsewhere)
    try:
        text = open(d.config).read()
        assert ": /" not in text and "socket: s.sock" in text, "paths are not all relative: " + text
        c = d.client()
        ans = c.call({"op": "generate", "id": "r", "model": "m", "prompt": "hi", "max_tokens": 3,
                      "temperature": 0})
        c.close()
        assert ans.get("event") == "done", ans
        assert not os.listdir(elsewhere), "files made in the working directory: %s" % os.listdir(elsewhere)
    finally:
        assert d.stop() == 0
    log = open(d.log_path).read()
    # a max_context the file sets above the model's is lowered with one warning (the default is not)
    assert log.count("max_context 4096 lowered to 512, the model's context_length") == 1, log


def burst(connect, n):
    """Opens n non-blocking connections at once, then sends one request on each and reads every
    answer. Returns how many answers came back, each with its own id."""
    socks = []
    for _ in range(n):
        socks.append(connect())
    answers = 0
    try:
        for i, s in enumerate(socks):
            s.setblocking(True)
            s.settimeout(gsd.scaled(30))
            s.sendall(json.dumps({"op": "models", "id": i}).encode() + b"\n")
        for i, s in enumerate(socks):
            line = s.makefile("rb").readline()
            ev = json.loads(line)
            answers += ev.get("id") == i and "models" in ev
    finally:
        for s in socks:
            s.close()
    return answers


def test_a_thousand_simultaneous_connects_are_all_answered():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    d = gsd.Daemon([("m", MODEL, "")], memory="4MiB")
    try:
        # the unix socket: a non-blocking connect fails with EAGAIN once the backlog is full
        def unix():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(d.sock)
            except BlockingIOError as e:
                s.close()
                raise AssertionError("connect refused (%s): the listen backlog is full" % errno.errorcode[e.errno])
            return s
        t0 = time.time()
        answers = burst(unix, 1000)
        assert answers == 1000, answers
        print("   unix: 1000 connects, 1000 answers in %.2f s" % (time.time() - t0))
        deadline = time.time() + gsd.scaled(10)
        while True:  # the daemon sees the closes as its loop gets to them
            st = d.stats()["server"]
            if st["curr_connections"] <= 1 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert st["total_connections"] >= 1000 and st["curr_connections"] <= 1, st
    finally:
        assert d.stop() == 0


def test_a_thousand_simultaneous_tcp_connects_are_all_answered():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    port = gsd.free_port()
    d = gsd.Daemon([("m", MODEL, "")], memory="4MiB", listen="tcp: 127.0.0.1:%d" % port)
    try:
        deadline = time.time() + gsd.scaled(10)  # the TCP listener comes up after the unix sockets
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.time() < deadline and d.proc.poll() is None, "no TCP listener:\n" + d.logtext()
                time.sleep(0.05)
        def tcp():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", port))
            assert err in (0, errno.EINPROGRESS), errno.errorcode.get(err, err)
            return s
        t0 = time.time()
        answers = burst(tcp, 1000)
        assert answers == 1000, answers
        print("   tcp: 1000 connects, 1000 answers in %.2f s" % (time.time() - t0))
    finally:
        assert d.stop() == 0



if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_check_config_fails_naming_a_missing_or_unsupported_model_file,
               test_relative_paths_in_the_config_are_taken_from_its_directory,
               test_a_thousand_simultaneous_connects_are_all_answered,
               test_a_thousand_simultaneous_tcp_connects_are_all_answered]:
        r.run(fn)
    sys.exit(r.exit_code())
