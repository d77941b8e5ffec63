"""The gpuswap CLI (build/gpuswap) against a real daemon on the sim backend: every command in text and --json, exit codes, Ctrl-C, lost connections; and the Python client's own tests."""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

GPUSWAP = os.path.join(gsd.BUILD, "gpuswap")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TMP = gsd.tmpdir(prefix="gsd-cli-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODELS = [
    ("m0", gsd.mkmodel(os.path.join(TMP, "m0.gguf"), SHAPE + " --seed 1"), ""),
    ("q0", gsd.mkmodel(os.path.join(TMP, "q0.gguf"), "--arch qwen2 " + SHAPE + " --seed 2"), "gpu_quota: 4MiB"),
    # slower per token and with a longer context: for Ctrl-C and lost connections mid-stream
    ("big", gsd.mkmodel(os.path.join(TMP, "big.gguf"), "--type f16 --dim 256 --layers 8 --heads 8 "
                        "--kv-heads 4 --ff 768 --vocab 400 --ctx 4096 --seed 3"), ""),
]
PROMPT = "Once upon a time"


class SlowDaemon(gsd.Daemon):
    """A daemon whose sim copies are throttled, so that `load` sends progress events."""

    def write_config(self, models, memory="2MiB", page="64KiB", extra="", scheduler=""):
        super().write_config(models, memory, page, extra, scheduler)
        with open(self.config) as f:
            text = f.read()
        with open(self.config, "w") as f:
            f.write(text.replace("  threads: 1\n", "  threads: 1\n  sim_bandwidth: 64MiB\n  fault_injection: true\n", 1))


# gpuswap keeps SIGINT ignored when it starts ignored (a background job of a script), and so
# does Python: a suite run in the background (`make test &`, nohup) would hand that on to every
# gpuswap here, whose Ctrl-C tests then see the answer run to its end. A handler of our own is
# reset to the default at exec, so the children start as from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)

D = SlowDaemon(MODELS, memory="32MiB", page="256KiB")


class paced:
    """Every pass of the daemon's at least 25 ms for a while (the admin "stall" fault), so that a
    signal sent mid-answer lands mid-answer also on a loaded host, where the client and this test
    may run late: greedy "Once" on big ends at eos after some 400 tokens, 0.3 s unpaced, 10 s
    paced."""

    def __enter__(self):
        ans = D.admin_call({"op": "fault", "id": "p", "fault": "stall", "count": 100000, "delay_ms": 25})
        assert ans.get("ok"), ans

    def __exit__(self, *exc):
        D.admin_call({"op": "fault", "id": "p", "fault": "off"})


def gs(*args, stdin=None, env=None, sockets=True, timeout=60):
    """Runs gpuswap; returns (rc, stdout str, stderr str). Output is decoded from UTF-8 as is
    (no newline translation: generated text holds any character)."""
    cmd = [GPUSWAP]
    if sockets:
        cmd += ["--socket", D.sock, "--admin-socket", D.admin]
    p = subprocess.run(cmd + list(args), input=stdin.encode() if stdin is not None else None,
                       stdin=subprocess.DEVNULL if stdin is None else None, capture_output=True,
                       env=env, timeout=gsd.scaled(timeout))
    err = p.stderr.decode("utf-8")
    assert_no_sanitizer_report(err)
    return p.returncode, p.stdout.decode("utf-8"), err


def assert_no_sanitizer_report(err):
    """An ASan/UBSan/LSan report (GPUSWAPD_BUILD=build-asan) fails the check whatever the exit code."""
    if isinstance(err, bytes):
        err = err.decode("utf-8", "replace")
    for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        assert mark not in err, err[-4000:]


def expect(res, rc, where=""):
    got, out, err = res
    assert got == rc, "%s: exit %d, wanted %d\nstdout: %r\nstderr: %r" % (where, got, rc, out[-2000:],
                                                                     err[-2000:])
    return out, err


# ------------------------------------------------------------------ usage


def test_help_for_the_tool_and_every_command():
    out, _ = expect(gs("--help", sockets=False), 0)
    for word in ("generate", "chat", "models", "stats", "load", "evict", "pin", "unpin", "reload",
                 "drain", "GPUSWAP_SOCKET", "GPUSWAP_ADMIN_SOCKET", "Exit status"):
        assert word in out, word
    assert re.search(r"^\s+3\s+cannot connect", out, re.M), out
    for cmd in ("generate", "chat", "models", "stats", "load", "evict", "pin", "unpin", "reload", "drain"):
        out, _ = expect(gs(cmd, "--help", sockets=False), 0, cmd)
        assert out.startswith("usage: gpuswap " + cmd), out
        out2, _ = expect(gs("help", cmd, sockets=False), 0, cmd)
        assert out2 == out
    out, _ = expect(gs("generate", "--help", sockets=False), 0)
    for opt in ("--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                "--seed", "--stop", "--json"):
        assert opt in out, opt


def test_bad_usage_exits_2_with_a_message_on_stderr():
    cases = [
        (),                                                 # no command
        ("frobnicate",),                                    # unknown command
        ("generate", PROMPT),                               # no -m
        ("generate", "-m", "m0", "-n", "abc", PROMPT),      # not a number
        ("generate", "-m", "m0", "--temp", "hot", PROMPT),  # not a number
        ("generate", "-m", "m0", "--bogus", PROMPT),        # unknown option
        ("generate", "-m"),                                 # option without its value
        ("models", "extra"),                                # stray argument
        ("stats", "--count", "0"),                          # out of range
        ("stats", "-i", "-1"),
        ("load",),                                          # no model
        ("evict", "m0", "q0"),                              # two models
        ("chat", "-m", "m0", "hello"),                      # chat reads stdin
        ("--json", "--bogus", "models"),
        ("models", "--json=1"),
    ]
    for args in cases:
        out, err = expect(gs(*args), 2, " ".join(args))
        assert err.startswith("gpuswap: ") or err.startswith("usage:"), (args, err)
        assert out == "", (args, out)


def test_no_daemon_exits_3():
    gone = os.path.join(TMP, "no-such.sock")
    for args in (("generate", "-m", "m0", PROMPT), ("models",), ("chat", "-m", "m0")):
        _, err = expect(gs("--socket", gone, *args, stdin="hi\n", sockets=False), 3, args[0])
        assert gone in err and "cannot connect" in err, err
    for args in (("stats",), ("load", "m0"), ("evict", "m0"), ("pin", "m0"), ("unpin", "m0"),
                 ("reload",), ("drain",)):
        _, err = expect(gs("--admin-socket", gone, *args, sockets=False), 3, args[0])
        assert gone in err, err
    # a socket file nobody listens on
    import socket
    dead = os.path.join(TMP, "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(dead)
    s.close()
    expect(gs("--socket", dead, "models", sockets=False), 3)


def test_environment_variables_name_the_sockets():
    env = dict(os.environ, GPUSWAP_SOCKET=D.sock, GPUSWAP_ADMIN_SOCKET=D.admin)
    out, _ = expect(gs("models", env=env, sockets=False), 0)
    assert "m0" in out
    out, _ = expect(gs("stats", env=env, sockets=False), 0)
    assert "m0" in out
    # the option wins over the environment
    env["GPUSWAP_SOCKET"] = os.path.join(TMP, "nothing.sock")
    expect(gs("models", env=env, sockets=False), 3)
    expect(gs("--socket", D.sock, "models", env=env, sockets=False), 0)


# ------------------------------------------------------------------ inference


def test_models_text_and_json():
    out, _ = expect(gs("models"), 0)
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["MODEL", "STATE"], lines
    rows = {l.split()[0]: l.split() for l in lines[1:]}
    assert set(rows) == {"m0", "q0", "big"}, rows
    assert rows["q0"][2] == "qwen2" and rows["m0"][2] == "llama" and rows["m0"][3] == "f16", rows
    out, _ = expect(gs("models", "--json"), 0)
    assert out.count("\n") == 1
    ans = json.loads(out)
    assert ans["ok"] and [m["name"] for m in ans["models"]] == ["m0", "q0", "big"], ans
    assert ans["models"][2]["context"] == 4096


def test_generate_prints_the_same_text_as_gpuswapd_generate_greedy():
    for name, path, _ in MODELS[:2]:
        want = gsd.generate_cli(path, PROMPT, 12)
        out, _ = expect(gs("generate", "-m", name, "-n", "12", "--temperature", "0", PROMPT), 0, name)
        assert out == want["text"] + "\n", (name, out, want["text"])
        out, _ = expect(gs("generate", "-m", name, "-n", "12", "--temp", "0", "--json", PROMPT), 0, name)
        assert out.count("\n") == 1, out
        done = json.loads(out)
        assert done["event"] == "done" and done["text"] == want["text"], (done, want)
        assert done["usage"] == {"prompt_tokens": len(want["prompt_ids"]), "completion_tokens": 12}, done
        assert done["finish_reason"] == "length"
    # the words of the prompt are joined with spaces
    a, _ = expect(gs("generate", "-m", "m0", "-n", "8", "--temp", "0", *PROMPT.split()), 0)
    b, _ = expect(gs("generate", "-m", "m0", "-n", "8", "--temp", "0", PROMPT), 0)
    assert a == b


def test_generate_reads_the_prompt_from_stdin():
    a, _ = expect(gs("generate", "-m", "m0", "-n", "8", "--temp", "0", stdin=PROMPT + "\n"), 0)
    b, _ = expect(gs("generate", "-m", "m0", "-n", "8", "--temp", "0", "-", stdin=PROMPT), 0)
    c, _ = expect(gs("generate", "-m", "m0", "-n", "8", "--temp", "0", PROMPT), 0)
    assert a == b == c, (a, b, c)


def test_generate_takes_every_sampling_option():
    args = ["generate", "-m", "q0", "--max-tokens=10", "--temperature", "0.9", "--top-k", "20", "--top-p",
            "0.9", "--min-p", "0.02", "--repeat-penalty", "1.1", "--seed", "42", "--json", PROMPT]
    a = json.loads(expect(gs(*args), 0)[0])
    b = json.loads(expect(gs(*args), 0)[0])
    assert a["text"] == b["text"], (a, b)  # same seed, same tokens
    # --stop, repeatable: the text ends before the first match
    full = json.loads(expect(gs("generate", "-m", "m0", "-n", "20", "--temp", "0", "--json", PROMPT), 0)[0])["text"]
    stop = full[6:8]
    done = json.loads(expect(gs("generate", "-m", "m0", "-n", "20", "--temp", "0", "--json", "--stop", stop,
                                "--stop", "\x01never\x01", PROMPT), 0)[0])
    assert done["finish_reason"] == "stop" and full.startswith(done["text"]), (full, stop, done)
    assert stop not in done["text"]


def test_generate_verbose_prints_timing_on_stderr():
    out, err = expect(gs("generate", "-m", "m0", "-n", "5", "--temp", "0", "-v", PROMPT), 0)
    assert re.search(r"\d+ prompt \+ 5 generated tokens \(length\); queue [\d.]+ ms, swap [\d.]+ ms.*"
                     r"ttft [\d.]+ ms, total [\d.]+ ms", err), err
    assert err not in out


def test_a_long_generation_streams_through_long_lines():
    # a done line longer than the reader's first buffer (1 KiB): random weights end at
    # their end-of-sequence token by chance, so look for a seed that talks long
    args = None
    for seed in range(40):
        args = ["generate", "-m", "m0", "-n", "2000", "--temp", "0.8", "--seed", str(seed), "a"]
        out, _ = expect(gs(*(args + ["--json"])), 0)
        if len(out) > 1500:
            break
    assert len(out) > 1500, len(out)
    done = json.loads(out)
    text, _ = expect(gs(*args), 0)
    assert text == done["text"] + "\n"


def test_unknown_model_exits_1_with_the_code_on_stderr():
    for args, stdin in ((("generate", "-m", "nope", PROMPT), None), (("chat", "-m", "nope"), "hi\n"),
                        (("load", "nope"), None), (("evict", "nope"), None), (("pin", "nope"), None),
                        (("unpin", "-m", "nope"), None)):
        out, err = expect(gs(*args, stdin=stdin), 1, args[0])
        assert "unknown_model" in err, (args, err)
        assert out.strip() == "", (args, out)
    # with --json the error answer is printed too
    out, err = expect(gs("generate", "-m", "nope", "--json", PROMPT), 1)
    assert json.loads(out)["error"]["code"] == "unknown_model" and "unknown_model" in err


def test_a_request_the_daemon_refuses_exits_1_with_bad_request():
    _, err = expect(gs("generate", "-m", "m0", "--temperature", "-1", PROMPT), 1)
    assert "bad_request" in err and "temperature" in err, err
    _, err = expect(gs("generate", "-m", "m0", "-n", "100000", PROMPT), 1)
    assert "context_overflow" in err, err
    # a prompt over the daemon's max_line (1 MiB): too_large, then the daemon hangs up
    _, err = expect(gs("generate", "-m", "m0", stdin="x" * (2 << 20)), 1)
    assert "too_large" in err, err


def test_chat_through_a_pipe_keeps_the_history():
    turns = ["hello", "how are you", "tell me a story"]
    out, _ = expect(gs("chat", "-m", "m0", "-n", "6", "--temp", "0", "--system", "Be brief.", "--json",
                       stdin="\n".join(turns) + "\n"), 0)
    dones = [json.loads(l) for l in out.splitlines()]
    assert len(dones) == 3 and all(d["event"] == "done" for d in dones), out
    # each answer is what the daemon says to the whole conversation so far
    c = D.client()
    msgs = [{"role": "system", "content": "Be brief."}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        want = c.call({"op": "chat", "id": i, "model": "m0", "messages": msgs, "max_tokens": 6,
                       "temperature": 0})
        assert want["text"] == dones[i]["text"], (i, want, dones[i])
        # the same prompt again: its prefix is cached now (usage.cached_tokens), the counts equal
        strip = lambda u: {k: v for k, v in u.items() if k != "cached_tokens"}  # noqa: E731
        assert strip(want["usage"]) == strip(dones[i]["usage"]), (i, want, dones[i])
        msgs.append({"role": "assistant", "content": want["text"]})
    c.close()
    # text mode: one streamed answer per line, no prompt on a pipe
    text, _ = expect(gs("chat", "-m", "m0", "-n", "6", "--temp", "0", "--system", "Be brief.",
                        stdin="\n".join(turns) + "\n"), 0)
    assert text == "".join(d["text"] + "\n" for d in dones), (text, dones)


def test_chat_ends_at_exit_and_skips_blank_lines_and_takes_a_last_line_without_newline():
    out, _ = expect(gs("chat", "-m", "q0", "-n", "4", "--temp", "0", "--json",
                       stdin="hello\n\n   \n/exit\nnot sent\n"), 0)
    assert len(out.splitlines()) == 1, out
    out, _ = expect(gs("chat", "-m", "q0", "-n", "4", "--temp", "0", "--json", stdin="hello\nagain"), 0)
    assert len(out.splitlines()) == 2, out
    out, _ = expect(gs("chat", "-m", "q0", "-n", "4", stdin=""), 0)
    assert out == ""
    # /reset forgets the history: the second "hello" gets the first answer again
    out, _ = expect(gs("chat", "-m", "q0", "-n", "4", "--temp", "0", "--json", stdin="hello\n/reset\nhello\n"), 0)
    a, b = [json.loads(l) for l in out.splitlines()]
    assert a["text"] == b["text"] and a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"], (a, b)


def test_chat_on_a_terminal_prompts_and_ctrl_c_stops_only_the_answer():
    # the greedy answer of big to "Once" runs for hundreds of tokens: Ctrl-C lands mid-answer
    master, slave = pty.openpty()
    p = subprocess.Popen([GPUSWAP, "--socket", D.sock, "chat", "-m", "big", "-n", "3000", "--temp", "0"],
                         stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""

    def read_until(pat, timeout=20):
        nonlocal seen
        deadline = time.time() + timeout
        while pat not in seen and time.time() < deadline:
            if not select.select([master], [], [], 0.5)[0]:
                continue
            try:
                seen += os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
        assert pat in seen, (pat, seen[-1000:])

    try:
        read_until(b"> ")
        assert b"Chatting with big" in seen, seen
        pace = paced()
        pace.__enter__()
        os.write(master, b"Once\n")
        start = len(seen)
        deadline = time.time() + 20
        while len(seen) < start + 30 and time.time() < deadline:  # the echo and the first tokens
            if select.select([master], [], [], 0.5)[0]:
                seen += os.read(master, 65536)
        p.send_signal(signal.SIGINT)
        read_until(b"[answer cancelled]\r\n> ")
        os.write(master, b"/exit\n")
        p.wait(20)
    finally:
        D.admin_call({"op": "fault", "id": "p", "fault": "off"})
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    assert_no_sanitizer_report(seen)
    assert p.returncode == 0, (p.returncode, seen[-1000:])


def test_ctrl_c_during_generate_sends_a_cancel_and_exits_130():
    with paced():
        ctrl_c_during_generate()


def ctrl_c_during_generate():
    before = D.stats()["models"]["big"]["total_cancelled"]
    p = subprocess.Popen([GPUSWAP, "--socket", D.sock, "generate", "-m", "big", "-n", "3000", "--temp", "0",
                          "-v", "Once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = os.read(p.stdout.fileno(), 1)  # tokens are streaming (unbuffered: communicate reads the fd)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    out, err = (first + out).decode(), err.decode()
    assert p.returncode == 130, (p.returncode, err)
    assert "(cancelled)" in err and "cancelled" in err.splitlines()[-1], err
    assert out.endswith("\n")
    after = D.stats()["models"]["big"]["total_cancelled"]
    assert after == before + 1, (before, after)
    # --json: the cancelled done is printed
    p = subprocess.Popen([GPUSWAP, "--socket", D.sock, "generate", "-m", "big", "-n", "3000", "--temp", "0",
                          "--json", "Once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # interrupt as soon as the request runs (a fixed wait let the whole answer finish once the
    # kernels got faster: --json prints nothing before its done line)
    deadline = time.time() + gsd.scaled(10)
    while D.stats()["models"]["big"]["curr_active"] == 0 and p.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 130, (p.returncode, err)
    done = json.loads(out)
    assert done["finish_reason"] == "cancelled" and done["usage"]["completion_tokens"] < 3000, done
    # SIGTERM the same way, exit 128+15
    p = subprocess.Popen([GPUSWAP, "--socket", D.sock, "generate", "-m", "big", "-n", "3000", "--temp", "0",
                          "Once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.read(p.stdout.fileno(), 1)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=20)
    assert p.returncode == 143, p.returncode


# ------------------------------------------------------------------ admin


def parse_stats_table(out):
    lines = out.splitlines()
    assert lines[0].startswith("gpuswapd: up "), lines
    hdr = lines[1]
    for col in ("MODEL", "STATE", "RESIDENT/QUOTA MiB", "PAGE-INS", "EVICTIONS", "HIT RATE", "QUEUE",
                "TTFT p50/p99 ms"):
        assert col in hdr, (col, hdr)
    rows = {}
    for l in lines[2:]:
        if l.startswith("pool: "):
            break
        f = l.split()
        rows[f[0]] = f
    pool = [l for l in lines if l.startswith("pool: ")]
    assert len(pool) == 1, lines
    return rows, pool[0]


def test_stats_table_has_the_model_rows_and_the_pool_line():
    expect(gs("generate", "-m", "m0", "-n", "3", PROMPT), 0)
    out, _ = expect(gs("stats"), 0)
    rows, pool = parse_stats_table(out)
    assert set(rows) == {"m0", "q0", "big"}, rows
    st = D.stats()
    m0 = st["models"]["m0"]
    r = rows["m0"]
    assert r[1] == m0["state"], (r, m0["state"])
    assert r[2] == "%.1f/-" % (m0["curr_resident_bytes"] / 1048576.0), r
    assert rows["q0"][2].endswith("/4.0"), rows["q0"]  # gpu_quota 4 MiB
    assert int(r[3]) == m0["total_page_ins"], (r, m0)
    assert r[5].endswith("%") and re.match(r"^[\d.]+/[\d.]+$", r[7]), r
    assert re.match(r"pool: \d+/\d+ pages used, \d+ free; [\d.]+ MiB used, [\d.]+ MiB free \(256 KiB pages\)$",
                    pool), pool
    out, _ = expect(gs("stats", "--json"), 0)
    ans = json.loads(out)
    assert ans["ok"] and set(ans["models"]) == {"m0", "q0", "big"} and "curr_pool_free" in ans["pool"], ans


def test_stats_watch_count_2_refreshes_twice():
    t0 = time.time()
    out, _ = expect(gs("stats", "--watch", "--count", "2", "-i", "0.3"), 0)
    assert time.time() - t0 >= 0.3
    assert out.count("MODEL") == 2 and out.count("pool: ") == 2, out
    assert "\033[" not in out  # no screen clearing when stdout is not a terminal
    out, _ = expect(gs("stats", "--count", "3", "-i", "0.1", "--json"), 0)
    lines = out.splitlines()
    assert len(lines) == 3 and all(json.loads(l)["ok"] for l in lines), out
    # on a terminal the screen is cleared before each table
    master, slave = pty.openpty()
    p = subprocess.Popen([GPUSWAP, "--admin-socket", D.admin, "stats", "-c", "2", "-i", "0.1"],
                         stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    data = read_pty(master, p)
    assert p.returncode == 0 and data.count(b"\033[H\033[2J") == 2, data[:500]


def read_pty(master, p, timeout=30):
    """Everything p writes to the terminal whose master side is master, until it closes it."""
    data = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not select.select([master], [], [], 0.5)[0]:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    p.wait(timeout)
    assert_no_sanitizer_report(data)
    return data


def test_load_prints_the_final_line_and_a_progress_bar_on_a_terminal():
    expect(gs("evict", "big"), 0)
    out, err = expect(gs("load", "big"), 0)
    m = re.match(r"^big resident \(([\d.]+) MiB in ([\d.]+) ms\)\n$", out)
    assert m, out
    weight = D.admin_call({"op": "models", "id": 1})["models"][2]["weight_bytes"]
    assert m.group(1) == "%.1f" % (weight / 1048576.0), (out, weight)
    assert float(m.group(2)) > 0, out  # throttled sim copies take time
    assert err == "", err  # no bar when stderr is not a terminal
    # loading a resident model answers at once
    out, _ = expect(gs("load", "big"), 0)
    assert out.startswith("big resident (")
    out, _ = expect(gs("load", "big", "--json"), 0)
    ans = json.loads(out)
    assert ans["ok"] and ans["state"] == "resident" and ans["bytes"] == weight, ans
    # a bar on stderr when it is a terminal
    expect(gs("evict", "big"), 0)
    master, slave = pty.openpty()
    p = subprocess.Popen([GPUSWAP, "--admin-socket", D.admin, "load", "big"], stdout=subprocess.PIPE,
                         stderr=slave)
    os.close(slave)
    bar = read_pty(master, p)
    out = p.stdout.read().decode()
    assert p.returncode == 0 and out.startswith("big resident ("), (p.returncode, out)
    assert re.search(rb"big \[[#.]{30}\] +\d+% [\d.]+/[\d.]+ MiB", bar), bar
    assert bar.endswith(b"\r\033[K"), bar[-40:]


def test_evict_pin_and_unpin():
    expect(gs("load", "m0"), 0)
    out, _ = expect(gs("pin", "m0"), 0)
    assert out == "m0 pinned\n", out
    out, err = expect(gs("evict", "m0"), 1)
    assert "bad_request" in err and "pinned" in err, err
    out, _ = expect(gs("unpin", "--json", "m0"), 0)
    assert json.loads(out) == {"id": 1, "ok": True, "model": "m0", "pinned": False}, out
    out, _ = expect(gs("evict", "-m", "m0"), 0)
    assert re.match(r"^m0 evicted \([\d.]+ MiB freed\)\n$", out), out
    assert D.stats()["models"]["m0"]["curr_resident_bytes"] == 0
    out, _ = expect(gs("evict", "m0", "--json"), 0)
    assert json.loads(out)["bytes_evicted"] == 0, out
    out, _ = expect(gs("pin", "--json", "q0"), 0)
    assert json.loads(out)["pinned"] is True
    out, _ = expect(gs("unpin", "q0"), 0)
    assert out == "q0 unpinned\n", out
    rows, _ = parse_stats_table(expect(gs("stats"), 0)[0])
    assert int(rows["m0"][4]) >= 1, rows["m0"]  # the admin eviction is counted


def test_reload_reports_changes_and_a_bad_file_exits_1():
    out, _ = expect(gs("reload"), 0)
    assert out == "reloaded: added none; removed none; changed none; settings none\n", out
    out, _ = expect(gs("reload", "--json"), 0)
    ans = json.loads(out)
    assert (ans["added"], ans["removed"], ans["changed"]) == ([], [], []), ans
    with open(D.config) as f:
        good = f.read()
    try:
        with open(D.config, "a") as f:
            f.write("    gpu_qouta: 1MiB\n")
        _, err = expect(gs("reload"), 1)
        assert "bad_request" in err and "gpu_qouta" in err, err
    finally:
        with open(D.config, "w") as f:
            f.write(good)
    expect(gs("reload"), 0)
    expect(gs("models"), 0)


def test_the_python_client_tests_pass():
    p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "clients", "python", "test_gpuswap.py")],
                       capture_output=True, text=True, timeout=300)
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    print("   python client: " + tail)
    assert p.returncode == 0 and re.match(r"^\d+ passed, 0 failed$", tail), p.stdout[-3000:] + p.stderr[-3000:]


def test_a_daemon_dying_mid_stream_exits_3():
    d = gsd.Daemon(MODELS[2:], memory="32MiB", page="256KiB")
    try:
        p = subprocess.Popen([GPUSWAP, "--socket", d.sock, "generate", "-m", "big", "-n", "3000", "Once"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.read(p.stdout.fileno(), 1)
        d.proc.kill()
        out, err = p.communicate(timeout=20)
        err = err.decode()
        assert p.returncode == 3, (p.returncode, err)
        assert "connection" in err and "lost" in err, err
        assert out.endswith(b"\n")
    finally:
        d.stop()


def test_drain_makes_the_daemon_exit_0():
    out, _ = expect(gs("drain"), 0)
    assert re.match(r"^drained: \d+ requests completed", out), out
    assert D.proc.wait(30) == 0, D.logtext()
    expect(gs("models"), 3)
    expect(gs("drain", "--json"), 3)


def main():
    r = gsd.Runner()
    try:
        for fn in (test_help_for_the_tool_and_every_command,
                   test_bad_usage_exits_2_with_a_message_on_stderr,
                   test_no_daemon_exits_3,
                   test_environment_variables_name_the_sockets,
                   test_models_text_and_json,
                   test_generate_prints_the_same_text_as_gpuswapd_generate_greedy,
                   test_generate_reads_the_prompt_from_stdin,
                   test_generate_takes_every_sampling_option,
                   test_generate_verbose_prints_timing_on_stderr,
                   test_a_long_generation_streams_through_long_lines,
                   test_unknown_model_exits_1_with_the_code_on_stderr,
                   test_a_request_the_daemon_refuses_exits_1_with_bad_request,
                   test_chat_through_a_pipe_keeps_the_history,
                   test_chat_ends_at_exit_and_skips_blank_lines_and_takes_a_last_line_without_newline,
                   test_chat_on_a_terminal_prompts_and_ctrl_c_stops_only_the_answer,
                   test_ctrl_c_during_generate_sends_a_cancel_and_exits_130,
                   test_stats_table_has_the_model_rows_and_the_pool_line,
                   test_stats_watch_count_2_refreshes_twice,
                   test_load_prints_the_final_line_and_a_progress_bar_on_a_terminal,
                   test_evict_pin_and_unpin,
                   test_reload_reports_changes_and_a_bad_file_exits_1,
                   test_the_python_client_tests_pass,
                   test_a_daemon_dying_mid_stream_exits_3,
                   test_drain_makes_the_daemon_exit_0):
            r.run(fn)
    finally:
        rc = D.stop()
        if rc not in (0, None):
            print("FAIL daemon exit status %r" % rc)
            r.failed += 1
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
