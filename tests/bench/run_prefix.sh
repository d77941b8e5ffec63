#!/usr/bin/env bash
# The conversation benchmark (issue 38): a 134M-parameter Q8_0 Llama, token-id prompts growing by
# BENCH_PREFIX_NEW (250) tokens a turn, max_tokens 1, BENCH_PREFIX_TURNS (10) turns, BENCH_THREADS
# (2) threads, /v1/completions-style requests over HTTP, one server after the other: gpuswapd (cpu
# backend) with its prefix cache on and off, and, with LLAMA_SERVER=path and/or
# LLAMA_SERVER_OLD=path (llama.cpp's llama-server binaries, built outside the repository), llama.cpp's
# server with cache_prompt on (one slot, the same file, the same threads). Every server is up at once
# and each turn goes to them one after the other, in an order that rotates; BENCH_PREFIX_ROUNDS (3)
# conversations (each new), medians per turn. Prints each turn's median per server and the ratios of
# the last turn; writes BUILD/bench/prefix.csv (server,round,turn,prompt_tokens,s).
#
# usage: run_prefix.sh BUILD [OUTDIR]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
mkdir -p "$OUT"
TURNS=${BENCH_PREFIX_TURNS:-10}
NEW=${BENCH_PREFIX_NEW:-250}
THREADS=${BENCH_THREADS:-2}
THREADS=${THREADS%% *} # one thread count: the first when several are given
ROUNDS=${BENCH_PREFIX_ROUNDS:-3}
m=$OUT/llama134m-q8_0-ctx4096.gguf
[ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type q8_0 --dim 768 --layers 12 --heads 12 \
    --kv-heads 12 --ff 2048 --vocab 32000 --ctx 4096 --seed 7 >/dev/null
for v in LLAMA_SERVER LLAMA_SERVER_OLD; do
    p=${!v:-}
    if [ -n "$p" ] && [ ! -x "$p" ]; then
        echo "$v=$p: not an executable llama-server" >&2
        exit 2
    fi
done
echo "== prefix cache: a $TURNS-turn conversation, +$NEW tokens a turn, max_tokens 1, $THREADS threads," \
     "134M Q8_0 Llama (dim 768, 12 layers, vocab 32000)"
echo "   CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
PYTHONPATH="$(dirname "$0")" exec /usr/bin/python3 - "$BUILD" "$OUT" "$m" "$TURNS" "$NEW" "$THREADS" "$ROUNDS" <<'EOF'
import json, os, random, shutil, signal, statistics, subprocess, sys, tempfile, time
from benchnet import free_port, post, wait_port

build, out, model = sys.argv[1], sys.argv[2], sys.argv[3]
turns, new, threads, rounds = map(int, sys.argv[4:8])
tmp = tempfile.mkdtemp(prefix="gsd-bench-prefix-")


def gpuswapd(cache):
    port = free_port()
    d = os.path.join(tmp, "on" if cache else "off")
    os.mkdir(d)
    cfg = os.path.join(d, "g.yaml")
    with open(cfg, "w") as f:
        f.write("listen:\n  socket: %s/s.sock\n  http: 127.0.0.1:%d\nadmin:\n  socket: %s/a.sock\n"
                "device:\n  backend: cpu\n  threads: %d\nscheduler:\n  prefix_cache: %s\n"
                "models:\n  - name: m\n    path: %s\n    max_context: 4096\n"
                % (d, port, d, threads, "true" if cache else "false", os.path.abspath(model)))
    proc = subprocess.Popen([os.path.join(build, "gpuswapd"), "--config", cfg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, "gpuswapd")
    return proc, lambda ids: post(port, "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 1,
                                                             "temperature": 0})


def llama(path):
    port = free_port()
    proc = subprocess.Popen([path, "-m", model, "-t", str(threads), "-tb", str(threads), "-c", "4096",
                             "-np", "1", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, path)
    return proc, lambda ids: post(port, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0,
                                                         "cache_prompt": True})


servers = [("gpuswapd cache on", lambda: gpuswapd(True)), ("gpuswapd cache off", lambda: gpuswapd(False))]
for v, name in (("LLAMA_SERVER", "llama.cpp current"), ("LLAMA_SERVER_OLD", "llama.cpp old")):
    if os.environ.get(v):
        servers.append(("%s cache_prompt" % name, lambda p=os.environ[v]: llama(p)))
names = [n for n, _ in servers]
times = {n: [[] for _ in range(rounds)] for n in names}
up = []
try:
    for name, start in servers:
        up.append(start())
    calls = dict(zip(names, (c for _, c in up)))
    for r in range(rounds):
        rnd = random.Random(38 + r)
        convo = [rnd.randrange(3, 32000) for _ in range(turns * new)]
        order = names[r % len(names):] + names[:r % len(names)]
        for t in range(1, turns + 1):
            for name in order:
                time.sleep(0.3)  # the last server's spinning threads, if any, back to sleep
                t0 = time.monotonic()
                calls[name](convo[:t * new])
                times[name][r].append(time.monotonic() - t0)
finally:
    for proc, _ in up:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
with open(os.path.join(out, "prefix.csv"), "w") as f:
    f.write("server,round,turn,prompt_tokens,s\n")
    for name in names:
        for r in range(rounds):
            for i, s in enumerate(times[name][r]):
                f.write("%s,%d,%d,%d,%.4f\n" % (name, r + 1, i + 1, (i + 1) * new, s))
med = {n: [statistics.median(times[n][r][i] for r in range(rounds)) for i in range(turns)] for n in names}
w = max(len(n) for n in names)
print("   medians of %d conversations, each turn to every server in turn" % rounds)
print("   %-*s %s" % (w, "prompt tokens", " ".join("%7d" % ((i + 1) * new) for i in range(turns))))
for name in names:
    print("   %-*s %s" % (w, name, " ".join("%6.2fs" % s for s in med[name])))
on = med["gpuswapd cache on"][-1]
print("   turn %d: cache off / on = %.1fx" % (turns, med["gpuswapd cache off"][-1] / on))
for name in names:
    if name.startswith("llama.cpp"):
        per = ", ".join("%.2fx" % (times["gpuswapd cache on"][r][-1] / times[name][r][-1])
                        for r in range(rounds))
        print("   turn %d: gpuswapd cache on / %s = %.2fx (per conversation %s)" % (turns, name, on / med[name][-1], per))
shutil.rmtree(tmp, ignore_errors=True)
EOF
