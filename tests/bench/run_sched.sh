#!/usr/bin/env bash
# run_sched.sh BUILD_DIR OUT_DIR: the scheduler scenarios of issue 14: the default policy beside fifo, lru, lru-batch N (every N the pool holds, and the best per metric) and Belady, on synthetic, bursty and real-trace workloads, each with the seeds of SCHED_SEEDS (default 1 2 3); models per GPU on H200 settings. CSVs, and a summary of default against the best baseline per metric.
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

# The scenarios run with each seed of SCHED_SEEDS (the arrivals, token counts
# and, for the real hour, the models' Zipf draw): a p99 of a 120 s run is the
# 5th-20th worst request, so one seed's ratios move by 10-40% from one draw to
# the next. The first seed's tables are printed and summarised row by row;
# the others run in the background (CSVs in $OUT/seeds/) for the summary over
# all seeds at the end.
SEEDS=${SCHED_SEEDS:-1 2 3}
FIRST=${SEEDS%% *}
mkdir -p "$OUT/seeds"
rm -f "$OUT"/seeds/sched_*.csv
SEED=$FIRST
run() { # label, then tracesim options
    local label=$1
    shift
    if [ "$SEED" = "$FIRST" ]; then
        echo "== $label: $*"
        "$SIM" --policies "$POL" --seed "$SEED" --label "$label" --csv "$OUT/sched_$label.csv" "$@" 2>&1 |
            grep -v '^lru-batch-[0-9]' || true
    else
        "$SIM" --policies "$POL" --seed "$SEED" --label "$label" --quiet \
            --csv "$OUT/seeds/sched_${label}_s$SEED.csv" "$@"
    fi
}

scenarios() {
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
}

for SEED in $SEEDS; do
    [ "$SEED" = "$FIRST" ] || scenarios &
done
SEED=$FIRST
scenarios
wait

# Default against the best baseline per metric (the lowest of fifo, lru and
# every lru-batch N), one line per scenario row and seed of the CSVs given:
# label load seed, default and best page-ins, p99 TTFT, p99 end-to-end, and
# the baseline configurations at least as good on all three (or "none").
compare() {
    awk -F, -v first="$FIRST" 'FNR == 1 {
            seed = first
            if (match(FILENAME, /_s[0-9]+\.csv$/)) seed = substr(FILENAME, RSTART + 2, RLENGTH - 6)
            next
        }
        $4 != "belady" && $4 != "lru-batch-best" {
            k = $1 SUBSEP $2 SUBSEP seed
            if ($4 == "default") { keys[k] = 1; dpi[k] = $8; dt[k] = $16; de[k] = $19; next }
            n[k]++; nm[k, n[k]] = $4; pi[k, n[k]] = $8 + 0; t[k, n[k]] = $16 + 0; e[k, n[k]] = $19 + 0
            if (!(k in bpi) || $8 + 0 < bpi[k]) bpi[k] = $8 + 0
            if (!(k in bt) || $16 + 0 < bt[k]) bt[k] = $16 + 0
            if (!(k in be) || $19 + 0 < be[k]) be[k] = $19 + 0
        }
        END {
            for (k in keys) {
                split(k, p, SUBSEP)
                dom = ""
                for (i = 1; i <= n[k]; i++)
                    if (pi[k, i] <= dpi[k] && t[k, i] <= dt[k] && e[k, i] <= de[k])
                        dom = dom (dom == "" ? "" : ",") nm[k, i]
                printf "%s %s %s %s %.9g %s %.9g %s %.9g %s\n", p[1], p[2], p[3], dpi[k], bpi[k], dt[k], bt[k],
                    de[k], be[k], (dom == "" ? "none" : dom)
            }
        }' "$@" </dev/null
}

# The CSVs of the first seed, or of every seed (all).
csvs() {
    for f in "$OUT"/sched_*.csv ${1:+"$OUT"/seeds/sched_*.csv}; do
        case $f in */sched_mpg_*) continue ;; esac # models per GPU: below (a rerun finds them here)
        [ -f "$f" ] && echo "$f"
    done
}

# The first seed, row by row; ratio default / best, '*' = default worse.
summary() {
    printf '%-24s %5s | %8s %8s %6s | %8s %8s %6s | %8s %8s %6s | %s\n' scenario load "pi def" "pi best" ratio \
        "ttft99 d" "best" ratio "e2e99 d" "best" ratio "better on all three"
    mapfile -t files < <(csvs)
    compare "${files[@]}" | awk '{
        r1 = $4 / ($5 ? $5 : 1); r2 = $6 / $7; r3 = $8 / $9
        printf "%-24s %5s | %8d %8d %5.2f%s | %8.2f %8.2f %5.2f%s | %8.2f %8.2f %5.2f%s | %s\n", $1, $2,
            $4, $5, r1, (r1 > 1 ? "*" : " "), $6, $7, r2, (r2 > 1 ? "*" : " "), $8, $9, r3, (r3 > 1 ? "*" : " "), $10
    }' | sort
}
echo
echo "default against the best baseline per metric (fifo, lru, lru-batch N); ratio default/best, '*' = default worse"
summary

# The same over every seed: per row the geometric mean of each ratio and the
# seeds where one baseline configuration is at least as good on all three
# figures; then the geometric means over all rows and seeds.
seeds_summary() {
    mapfile -t files < <(csvs all)
    compare "${files[@]}" | awk -v order="$SEEDS" '{
            r = $1 SUBSEP $2; rows[r] = 1
            l1 = log($4 / ($5 ? $5 : 1)); l2 = log($6 / $7); l3 = log($8 / $9)
            s1[r] += l1; s2[r] += l2; s3[r] += l3; c[r]++
            a1 += l1; a2 += l2; a3 += l3; na++
            if ($10 != "none") { d[r]++; ds[$3]++; nd++ }
        }
        END {
            printf "%-24s %5s | %7s %7s %7s | %s\n", "scenario", "load", "pi", "ttft99", "e2e99", "seeds beaten outright"
            for (r in rows) {
                split(r, p, SUBSEP)
                printf "%-24s %5s | %7.2f %7.2f %7.2f | %d of %d\n", p[1], p[2], exp(s1[r] / c[r]),
                    exp(s2[r] / c[r]), exp(s3[r] / c[r]), d[r], c[r] | "sort"
            }
            close("sort")
            per = ""
            ns = split(order, so, " ")
            for (i = 1; i <= ns; i++) per = per sprintf("%sseed %s: %d", i > 1 ? ", " : "", so[i], ds[so[i]])
            printf "all %d rows x seeds: geomeans page-ins %.3f, p99 TTFT %.3f, p99 end-to-end %.3f; beaten outright %d (%s)\n",
                na, exp(a1 / na), exp(a2 / na), exp(a3 / na), nd, per
        }'
}
if [ "$SEEDS" != "$FIRST" ]; then
    echo
    echo "the same over seeds $SEEDS: geometric means of default/best per row, and the seeds where one baseline configuration beats the default on all three"
    seeds_summary
fi

# Models per GPU: H200 settings (55 GB/s host-to-device, 4.8 TB/s HBM, a 120 GiB
# pool), Llama-3-8B-shaped models at 0.1 req/s each, uniform, the most models whose
# p99 TTFT stays within 2 s with each of MPG_SEEDS seeds (default 3: one seed's p99 moves
# by 20-40% near the limit), to within MPG_STEP models (default 1); BF16- and Q4_K_M-sized (4.85 bits a
# weight).
H200="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --models-per-gpu 0.1 --mpg-step ${MPG_STEP:-1} --duration ${MPG_DURATION:-300} --mpg-seeds ${MPG_SEEDS:-3}"
echo
echo "== models per GPU within p99 TTFT 2 s (H200 settings, 8B at 0.1 req/s each, uniform; synthetic tokens, and -trace: tokens from the real hour)"
mpg() { # label, then tracesim options: every policy
    local label=$1
    shift
    "$SIM" $H200 "$@" --label "$label" --policies default,fifo,lru,lru-batch --csv "$OUT/sched_mpg_$label.csv" --quiet
}
mpg bf16 --wbytes 2 --mpg-max 60 &
mpg q4km --wbytes 0.60625 --mpg-max 120 &
# The same with the real token mix: Poisson arrivals as above, each request's
# prompt and output tokens a seeded draw from the real hour of LLM requests
# (prompts mean 2048 tokens, outputs mean 28), context 8192.
if [ -f "$TRACE" ]; then
    mpg bf16-trace --tokens-from "$TRACE" --max-context 8192 --wbytes 2 --mpg-max 60 &
    mpg q4km-trace --tokens-from "$TRACE" --max-context 8192 --wbytes 0.60625 --mpg-max 120 &
    # clients asking for 4096 tokens and stopping at the trace's output (an end of sequence):
    # the scheduler knows only what they ask and what finished sequences used (sched_passes_left)
    mpg q4km-trace-ask4096 --tokens-from "$TRACE" --max-context 8192 --ask-tokens 4096 --wbytes 0.60625 \
        --mpg-max 120 &
fi
wait
awk -F, 'FNR > 1 && ($2 !~ /^lru-batch-[0-9]/) { printf "%-16s %-16s %4d models (p99 TTFT %.2f s; %d: %.2f s)\n", $1, $2, $3, $4, $5, $6 }' \
    "$OUT"/sched_mpg_*.csv
# What one step more would ask of the copy engine (BF16, real mix, 35 models at 0.1 req/s, a pool
# of 7, page-ins of 0.29 s: docs/scheduling.md): the p99 of page-ins served first come first served alone.
/usr/bin/python3 "$(dirname "$0")/copy_queue_bound.py" 3.5 0.78 0.293 300 200 1
echo "results: $OUT/sched_*.csv ($(( $(date +%s) - t0 )) s)"
