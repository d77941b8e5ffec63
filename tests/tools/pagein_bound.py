#!/usr/bin/python3
"""A lower bound on what any scheduling policy copies to the device to serve a request trace with
its p99 wait for a model within X seconds, from residency alone (compute free, copies instant, the
pool all weights): a check on whether issue 14's scenario bar is excluded by the copy engine and the
pool. Input: `tracesim --dump-requests` output (its first run's requests are used).

Model: a request of model m arriving at a is served once m is wholly on the device within
[a, a + X]; at most n - ceil(0.99 n) requests may wait longer (tracesim's p99). A policy's visits
to m group m's requests: a group a_i..a_j costs one load of m's size (less what m kept meanwhile)
and holds m's pages from a_i + X to a_j. The pool holds at most P units at any time. Weak duality
over the pool's unit-seconds (multiplier lam) and the late requests (multiplier mu) gives, for
every lam, mu >= 0, a bound  sum_m S dp_m(lam, mu) - lam P H - mu K  (H: last arrival + X), where
dp_m is the cheapest cover of m's requests (an O(requests) recurrence); the best over a grid is
printed, in bytes and in segments (segments: S = segments a model, P = the most segments the pool
holds at once, from the smallest segment).

usage: pagein_bound.py DUMP X MODEL_BYTES POOL_BYTES SEGMENTS POOL_SEGMENTS"""
import csv
import math
import sys


def cover_cost(a, x, lam, mu):
    """Cheapest cover of sorted arrivals a, in loads: a group a_i..a_j costs
    1 + lam * max(0, a_j - a_i - x), a request left late costs mu."""
    k = len(a)
    dp = [0.0] * (k + 1)
    pm = [math.inf] * (k + 1)  # pm[t] = min over 1 <= i <= t of dp[i-1] - lam * a_i
    lo = 1
    for j in range(1, k + 1):
        aj = a[j - 1]
        pm[j] = min(pm[j - 1], dp[j - 1] - lam * aj)
        while a[lo - 1] < aj - x:
            lo += 1
        best = min(dp[j - 1] + mu, dp[lo - 1] + 1.0)
        if lo > 1:
            best = min(best, 1.0 + lam * (aj - x) + pm[lo - 1])
        dp[j] = best
    return dp[k]


def bound(arrivals, size, pool, x, late):
    """Best dual bound over a grid of (lam, mu), refined around the best point."""
    horizon = max(max(a) for a in arrivals if a) + x

    def dual(lam, mu):
        return (sum(size * cover_cost(a, x, lam, mu / size) for a in arrivals if a) -
                lam * pool * horizon - mu * late)

    lams = [0.0] + [10 ** (-5 + 6 * i / 39) for i in range(40)]
    mus = [0.0] + [size * 10 ** (-3 + 4 * i / 24) for i in range(25)]
    best = max((dual(l, m), l, m) for l in lams for m in mus)
    for _ in range(3):
        _, lam, mu = best
        steps = [0.7 + 0.05 * i for i in range(15)]
        best = max([best] + [(dual(lam * f, mu * g), lam * f, mu * g) for f in steps for g in steps])
    return best[0]


def main(argv):
    if len(argv) != 7:
        sys.exit(__doc__.split("usage: ")[1])
    path, x = argv[1], float(argv[2])
    size_b, pool_b, size_s, pool_s = (float(v) for v in argv[3:7])
    with open(path) as f:
        rows = list(csv.DictReader(f))
    cut = next((i for i in range(1, len(rows)) if int(rows[i]["index"]) <= int(rows[i - 1]["index"])),
               len(rows))
    rows = rows[:cut]
    n = len(rows)
    late = n - math.ceil(0.99 * n)
    n_models = max(int(r["model"]) for r in rows) + 1
    arrivals = [sorted(float(r["arrival_s"]) for r in rows if int(r["model"]) == m)
                for m in range(n_models)]
    print(f"{n} requests, at most {late} over {x} s: bytes >= {bound(arrivals, size_b, pool_b, x, late):.4g}, "
          f"segments >= {bound(arrivals, size_s, pool_s, x, late):.1f}")


if __name__ == "__main__":
    main(sys.argv)
