#!/usr/bin/python3
"""The copy engine alone as a first-come-first-served queue (M/D/1): Poisson requests, each needing
a page-in of fixed length with a given probability, nothing else in the way. Its p99 wait is what a
scheduler that pages a cold model in for each such request cannot beat on average (it can only
share a page-in among requests of one model). docs/scheduling.md, models per GPU: 35 BF16 models at 0.1 req/s
each, a pool of 7, page-ins of 0.29 s.

usage: copy_queue_bound.py [rate_rps miss_fraction pagein_s duration_s draws seed]"""
import sys

import numpy as np


def p99s(rate, miss, pagein, duration, draws, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        t = np.sort(rng.uniform(0, duration, rng.poisson(rate * duration)))
        cold = rng.random(len(t)) < miss
        free, waits = 0.0, []
        for a, c in zip(t, cold):
            if not c:
                waits.append(0.0)
                continue
            free = max(a, free) + pagein
            waits.append(free - a)
        out.append(np.percentile(waits, 99))
    return np.array(out)


def main():
    a = [float(x) for x in sys.argv[1:]] or [3.5, 0.78, 0.293, 300, 200, 1]
    rate, miss, pagein, duration, draws, seed = a
    p = p99s(rate, miss, pagein, duration, int(draws), int(seed))
    print("M/D/1 copy engine: %.2f req/s, %.0f%% cold, page-in %.3f s, %d draws of %.0f s: "
          "p99 wait median %.2f s, 90th percentile %.2f s, above 2 s in %.0f%% of draws" % (
              rate, miss * 100, pagein, int(draws), duration, np.median(p), np.percentile(p, 90),
              100 * (p > 2).mean()))


if __name__ == "__main__":
    main()
