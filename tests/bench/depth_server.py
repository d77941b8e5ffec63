#!/usr/bin/python3
"""Prefill and decode speed from a cache depth through a llama.cpp llama-server, for a llama.cpp whose
llama-bench has no -d (c392e50): the server holds DEPTH tokens in its slot (cache_prompt), then each
repetition sends them with PREFILL new tokens and asks for DECODE more (ignore_eos), and the server's
own timings give the new tokens' prefill and the decode rates; the best of REPS. One line per thread
count, as run_engine.sh reads them: threads,prefill_tok_s,decode_tok_s.

usage: depth_server.py LLAMA_SERVER MODEL DEPTH PREFILL DECODE REPS THREADS...
"""
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchnet import free_port, post, wait_port  # noqa: E402


def main():
    if len(sys.argv) < 8:
        raise SystemExit(__doc__)
    server, model = sys.argv[1], sys.argv[2]
    depth, np_, nd, reps = map(int, sys.argv[3:7])
    rnd = random.Random(43)
    base = [rnd.randrange(3, 32000) for _ in range(depth)]
    ctx = (depth + np_ + nd + 1023) // 1024 * 1024
    for th in sys.argv[7:]:
        port = free_port()
        proc = subprocess.Popen([server, "-m", model, "-t", th, "-tb", th, "-c", str(ctx), "-np", "1",
                                 "-b", "512", "--host", "127.0.0.1", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, proc, server)
            post(port, "/completion", {"prompt": base, "n_predict": 1, "temperature": 0, "cache_prompt": True})
            best_p = best_d = 0.0
            for _ in range(reps):
                new = [rnd.randrange(3, 32000) for _ in range(np_)]
                t = post(port, "/completion", {"prompt": base + new, "n_predict": nd, "temperature": 0,
                                "cache_prompt": True, "ignore_eos": True})["timings"]
                if t["prompt_n"] != np_ or t["predicted_n"] != nd:
                    raise SystemExit("the server prefilled %d (not %d) or decoded %d (not %d)"
                                     % (t["prompt_n"], np_, t["predicted_n"], nd))
                best_p = max(best_p, t["prompt_per_second"])
                best_d = max(best_d, t["predicted_per_second"])
            print("%s,%.1f,%.1f" % (th, best_p, best_d), flush=True)
        finally:
            proc.terminate()
            proc.wait()


main()
