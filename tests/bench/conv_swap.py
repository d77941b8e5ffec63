#!/usr/bin/python3
"""The conversation-swap benchmark (issue 39): a 10-turn conversation with the 134M Q8_0 bench model
on the sim backend (copies throttled to BENCH_CONV_GBS, 2 GB/s by default; BENCH_THREADS threads),
turn 10's time to first token in three runs, one after the other: the model stays on the device
(its prefix cache hits), it is paged out (admin evict) before turn 10 with the host-RAM KV tier on
(the history is copied back), and paged out with the tier off (host.kv_cache: 0, the history is
prefilled again). Prints each and writes OUT/conv_swap.csv (run,turn10_ttft_ms,swap_ms,
after_swap_ms,prompt_tokens,cached_tokens).

usage: conv_swap.py BUILD OUT MODEL.gguf"""
import csv
import os
import random
import sys

BUILD, OUT, MODEL = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
os.environ.setdefault("GPUSWAPD_BUILD", BUILD)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import gsd  # noqa: E402

TURNS, NEW, GEN = 10, 200, 16
GBS = float(os.environ.get("BENCH_CONV_GBS", "2"))
THREADS = int(os.environ.get("BENCH_THREADS", "2").split()[0])


class ConvDaemon(gsd.Daemon):
    def __init__(self, kv_host):
        self.kv_host = kv_host
        super().__init__([("m", MODEL, "max_context: 4096")], memory="512MiB", page="2MiB")

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read()
        text = text.replace("  threads: 1\n", "  threads: %d\n  sim_bandwidth: %dB/s\n"
                            % (THREADS, int(GBS * 1e9)), 1)
        text = text.replace("models:\n", "host:\n  kv_cache: %s\nmodels:\n" % self.kv_host, 1)
        with open(self.config, "w") as f:
            f.write(text)


def ask(c, rid, tokens):
    ans = c.call({"op": "generate", "id": rid, "model": "m", "tokens": tokens, "max_tokens": GEN,
                  "temperature": 0})
    assert ans.get("event") == "done", ans
    return ans


def run(label, evict, kv_host):
    d = ConvDaemon(kv_host)
    try:
        c = d.client(timeout=600)
        rng = random.Random(1)
        history = []
        for t in range(1, TURNS + 1):
            history += [rng.randrange(3, 32000) for _ in range(NEW)]
            if t == TURNS and evict:
                ans = d.admin_call({"op": "evict", "id": "e", "model": "m"})
                assert "error" not in ans, ans
            done = ask(c, "t%d" % t, history)
            history += [int(x) for x in done.get("tokens", [])] or [rng.randrange(3, 32000)]
        tm, usage = done["timing"], done["usage"]
        st = d.stats()["models"]["m"]
        c.close()
        row = (label, tm["ttft_ms"], tm["swap_ms"], tm["ttft_ms"] - tm["swap_ms"],
               usage["prompt_tokens"], usage.get("cached_tokens", 0))
        print("  %-28s turn %d: ttft %8.1f ms (page-in %6.1f ms, after it %8.1f ms); %d prompt "
              "tokens, %d from cache; restores %d" % (label, TURNS, row[1], row[2], row[3], row[4],
                                                     row[5], st["total_kv_restores"]))
        return row
    finally:
        assert d.stop() == 0


def main():
    print("== conversations across a swap: %d turns of +%d tokens (max_tokens %d), 134M Q8_0, sim "
          "backend at %.1f GB/s, %d threads" % (TURNS, NEW, GEN, GBS, THREADS))
    rows = [run("resident (prefix cache)", False, "1GiB"),
            run("swapped, host KV tier", True, "1GiB"),
            run("swapped, no host tier", True, "0")]
    path = os.path.join(OUT, "conv_swap.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("run", "turn10_ttft_ms", "swap_ms", "after_swap_ms", "prompt_tokens",
                    "cached_tokens"))
        w.writerows(rows)
    print("  after the page-in: host tier %.2fx of the re-prefill (%.1f against %.1f ms); results: %s"
          % (rows[1][3] / rows[2][3], rows[1][3], rows[2][3], path))


if __name__ == "__main__":
    main()
