#!/usr/bin/env bash
# run_sched.sh BUILD_DIR OUT_DIR: the scheduler scenarios of issue 14: the default policy beside fifo, lru, lru-batch N (every N the pool holds, and the best per metric) and Belady, on synthetic, bursty and real-trace workloads; models per GPU on H200 settings. CSVs, and a summary of default against the best baseline per metric.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
SIM=$BUILD/tracesim
DUR=${SCHED_DURATION:-120}
mkdir -p "$OUT"
[ -x "$SIM" ] || { echo "run_sched.sh: $SIM not built (make $SIM)" >&2; exit 1; }
t0=$(date +%s)
POL=default,fifo,lru,lru-batch,belady
TRACE=$(dirname "$0")/../data/traces/AzureLLMInferenceTrace_code.csv

run() { # label, then tracesim options
    local label=$1
    shift
    echo "== $label: $*"
    "$SIM" --policies "$POL" --label "$label" --csv "$OUT/sched_$label.csv" "$@" 2>&1 | grep -v '^lru-batch-[0-9]' || true
}

# Synthetic: Zipf 1.0 and uniform popularity, 4 and 12 models (Llama-3-8B-shaped
# Q8_0, 8.6 GB; the pool holds 3 plus 4 GiB of KV), Poisson arrivals at 0.2, 0.6
# and 0.95 of the ideal capacity.
for z in 1.0 0; do
    for m in 4 12; do
        run "zipf$z-m$m" --zipf "$z" --models "$m" --duration "$DUR" --sweep 0.2,0.6,0.95
    done
done
# Bursty arrivals (Gamma, CV 3), Zipf 1.0, 12 models, load 0.6.
run bursty-zipf1.0-m12 --arrival gamma --cv 3 --models 12 --duration "$DUR" --load 0.6
# Mixed sizes (H200 copy and HBM bandwidth): Llama-3-8B, 3.2-3B and 3-70B shapes,
# 6 models (8B, 3B, 70B, 8B, 3B, 70B), Zipf 1.0, 1 req/s for 60 s. Q4_K_M-sized with
# a 60 GiB pool; Q4_K_M-sized with a 40 GiB pool and a 24 GiB quota, below the 70B's
# 42.5 GB; BF16 with a 120 GiB pool and a 60 GiB quota, below the 70B's 141 GB (its
# steps stream what the quota leaves out). lru loads only whole models: not with quotas.
MIX="--h2d-gbs 55 --hbm-gbs 4800 --models 6 --rate 1 --duration 60"
run mix-q4 $MIX --mix 8b-q4,3b-q4,70b-q4 --pool-gib 60
POL=default,fifo,lru-batch,belady run mix-q4-70b-quota $MIX --mix 8b-q4,3b-q4,70b-q4 --pool-gib 40 --quota-gib 24
POL=default,fifo,lru-batch,belady run mix-bf16-70b-quota $MIX --mix 8b-bf16,3b-bf16,70b-bf16 --pool-gib 120 --quota-gib 60
# The real hour of LLM requests (Azure LLM inference 2023, code): real arrivals and
# token counts, 12 models by a seeded Zipf 1.0 draw, context 8192.
if [ -f "$TRACE" ]; then
    run llm-trace-zipf1.0-m12 --llm-trace "$TRACE" --models 12 --max-context 8192
fi

# default against the best baseline per metric
summary() {
    printf '%-24s %5s | %8s %8s %6s | %8s %8s %6s | %8s %8s %6s | %s\n' scenario load "pi def" "pi best" ratio \
        "ttft99 d" "best" ratio "e2e99 d" "best" ratio "better on all three"
    for f in "$OUT"/sched_*.csv; do
        case $f in */sched_mpg_*) continue ;; esac # models per GPU: below (a rerun finds them here)
        awk -F, 'FNR == 1 { file++ } FNR > 1 && $4 != "belady" && $4 != "lru-batch-best" {
            k = $1 SUBSEP $2
            if ($4 == "default") { keys[k] = 1; dpi[k] = $8; dt[k] = $16; de[k] = $19; next }
            n[k]++; nm[k, n[k]] = $4; pi[k, n[k]] = $8 + 0; t[k, n[k]] = $16 + 0; e[k, n[k]] = $19 + 0
            if (!(k in bpi) || $8 + 0 < bpi[k]) bpi[k] = $8 + 0
            if (!(k in bt) || $16 + 0 < bt[k]) bt[k] = $16 + 0
            if (!(k in be) || $19 + 0 < be[k]) be[k] = $19 + 0
        }
        END {
            for (k in keys) {
                split(k, p, SUBSEP)
                r1 = dpi[k] / (bpi[k] ? bpi[k] : 1); r2 = dt[k] / bt[k]; r3 = de[k] / be[k]
                # one baseline configuration at least as good on every figure
                dom = ""
                for (i = 1; i <= n[k]; i++)
                    if (pi[k, i] <= dpi[k] && t[k, i] <= dt[k] && e[k, i] <= de[k])
                        dom = dom (dom == "" ? "" : ",") nm[k, i]
                printf "%-24s %5s | %8d %8d %5.2f%s | %8.2f %8.2f %5.2f%s | %8.2f %8.2f %5.2f%s | %s\n", p[1], p[2],
                    dpi[k], bpi[k], r1, (r1 > 1 ? "*" : " "), dt[k], bt[k], r2, (r2 > 1 ? "*" : " "),
                    de[k], be[k], r3, (r3 > 1 ? "*" : " "), (dom == "" ? "none" : dom)
            }
        }' "$f" | sort
    done
}
echo
echo "default against the best baseline per metric (fifo, lru, lru-batch N); ratio default/best, '*' = default worse"
summary

# Models per GPU: H200 settings (55 GB/s host-to-device, 4.8 TB/s HBM, a 120 GiB
# pool), Llama-3-8B-shaped models at 0.1 req/s each, uniform, the most models whose
# p99 TTFT stays within 2 s, to within 5 models; BF16- and Q4_K_M-sized (4.85 bits
# a weight).
H200="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --models-per-gpu 0.1 --mpg-step 5 --duration ${MPG_DURATION:-300}"
echo
echo "== models per GPU within p99 TTFT 2 s (H200 settings, 8B at 0.1 req/s each, uniform; synthetic tokens, and -trace: tokens from the real hour)"
mpg() { # label, then tracesim options: every policy
    local label=$1
    shift
    "$SIM" $H200 "$@" --label "$label" --policies default,fifo,lru,lru-batch --csv "$OUT/sched_mpg_$label.csv" --quiet
}
mpg bf16 --wbytes 2 --mpg-max 60
mpg q4km --wbytes 0.60625 --mpg-max 120
# The same with the real token mix: Poisson arrivals as above, each request's
# prompt and output tokens a seeded draw from the real hour of LLM requests
# (prompts mean 2048 tokens, outputs mean 28), context 8192.
if [ -f "$TRACE" ]; then
    mpg bf16-trace --tokens-from "$TRACE" --max-context 8192 --wbytes 2 --mpg-max 60
    mpg q4km-trace --tokens-from "$TRACE" --max-context 8192 --wbytes 0.60625 --mpg-max 120
fi
awk -F, 'FNR > 1 && ($2 !~ /^lru-batch-[0-9]/) { printf "%-16s %-16s %4d models (p99 TTFT %.2f s; %d: %.2f s)\n", $1, $2, $3, $4, $5, $6 }' \
    "$OUT"/sched_mpg_*.csv
echo "results: $OUT/sched_*.csv ($(( $(date +%s) - t0 )) s)"
