#!/usr/bin/env bash
# The trace-driven simulator's self-test (determinism, Belady bound, no pool over-commit) and a small fleet: 4 hosts, 40 models, affinity vs round-robin vs least-loaded.
set -euo pipefail
SIM="${GPUSWAPD_BUILD:-build}/tracesim"
"$SIM" --self-test

csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
"$SIM" --hosts 4 --models 40 --duration 30 --load 0.5 --quiet --csv "$csv"
awk -F, 'NR > 1 {
    n++
    if ($5 != $6 || $7 != 0) { printf "FAIL %s: %s of %s requests completed, %s failed\n", $4, $6, $5, $7; bad = 1 }
    else printf "ok   fleet %s: every request completes (%s)\n", $4, $6
    if ($24 != 0) { printf "FAIL %s: %s pool violations\n", $4, $24; bad = 1 }
    pi[$4] = $8; p99[$4] = $16
}
END {
    if (n != 3) { print "FAIL fleet: want 3 rows, got " n; exit 1 }
    ok = pi["affinity"] < pi["round-robin"] && pi["affinity"] < pi["least-loaded"]
    printf "%s fleet: affinity %d page-ins < round-robin %d and least-loaded %d (p99 TTFT %.2f / %.2f / %.2f s)\n",
        ok ? "ok  " : "FAIL", pi["affinity"], pi["round-robin"], pi["least-loaded"],
        p99["affinity"], p99["round-robin"], p99["least-loaded"]
    exit (bad || !ok)
}' "$csv"
