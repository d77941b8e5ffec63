#!/usr/bin/env bash
# run_lora_sim.sh BUILD_DIR OUT_DIR: issue 46's LoRA rows in tracesim: H200 settings, an 8B BF16 base with rank-16 adapters on q, k, v, o, max_batch 64, 0.1 req/s per adapter: the most adapters within p99 TTFT 2 s with each of 3 seeds for the default, the default with free swaps, multi-LoRA with S device slots (vLLM's max_loras, S = 1 .. 64) and separate merged models (lru, lru-batch), at the cost model's 400 TFLOP/s and at the datasheet's 989. CSVs in OUT_DIR/lora_sim_*.csv; ~1.5 min on one core.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
SIM=$BUILD/tracesim
mkdir -p "$OUT"
[ -x "$SIM" ] || { echo "run_lora_sim.sh: $SIM not built (make $SIM)" >&2; exit 1; }
t0=$(date +%s)
# --lora-adapters 1 turns the adapter workload on; --models-per-gpu then searches the adapter count
H200="--hbm-gbs 4800 --pool-gib 120 --wbytes 2 --max-batch 64 --models 1 --lora-adapters 1
    --lora-rank 16 --lora-targets q,k,v,o --models-per-gpu 0.1 --duration ${LORA_DURATION:-300}
    --mpg-seeds ${LORA_SEEDS:-3} --quiet"
echo "== LoRA adapters per GPU within p99 TTFT 2 s (H200 settings, 8B BF16 base, rank 16 on q, k, v, o," \
    "max_batch 64, 0.1 req/s per adapter, uniform, ${LORA_SEEDS:-3} seeds)"
run() { # label, then tracesim options
    local label=$1
    shift
    "$SIM" $H200 --label "$label" --csv "$OUT/lora_sim_$label.csv" "$@"
}
run lora --h2d-gbs 55 --mpg-step 5 --mpg-max 800 --policies default,lora-slots
run lora-free-swaps --h2d-gbs 1e6 --mpg-step 5 --mpg-max 800 --policies default
run lora-merged --h2d-gbs 55 --lora-merged --mpg-step 1 --mpg-max 60 --policies default,lru,lru-batch
# the same at 989 TFLOP/s (H200 dense BF16) instead of the cost model's 400: the base's compute bounds
run lora-989tflops --h2d-gbs 55 --tflops 989 --mpg-step 5 --mpg-max 1200 --policies default,lora-slots
run lora-989tflops-free-swaps --h2d-gbs 1e6 --tflops 989 --mpg-step 5 --mpg-max 1200 --policies default
run lora-989tflops-merged --h2d-gbs 55 --tflops 989 --lora-merged --mpg-step 1 --mpg-max 80 \
    --policies default,lru,lru-batch
awk -F, 'FNR > 1 { printf "%-16s %-16s %4d adapters (p99 TTFT %.2f s; %d: %.2f s)\n", $1, $2, $3, $4, $5, $6 }' \
    "$OUT"/lora_sim_lora.csv "$OUT"/lora_sim_lora-free-swaps.csv "$OUT"/lora_sim_lora-merged.csv \
    "$OUT"/lora_sim_lora-989tflops.csv "$OUT"/lora_sim_lora-989tflops-free-swaps.csv \
    "$OUT"/lora_sim_lora-989tflops-merged.csv
verdict() { # WHAT, then the default/slots, free-swap and merged CSVs' labels
    awk -F, -v what="$1" -v a="$2" -v f="$3" -v m="$4" 'FNR > 1 { n[$1 "/" $2] = $3 }
    END {
        d = n[a "/default"]; fs = n[f "/default"]; s = n[a "/lora-slots-best"]
        l = n[m "/lru"]; b = n[m "/lru-batch-best"]
        printf "%s: default %d adapters (issue 46: >= 400): %s; free swaps %d (%.2fx, >= 0.9x: %s); multi-LoRA slots best %d, merged lru %d, lru-batch best %d (more than both: %s)\n",
            what, d, (d >= 400 ? "yes" : "no"), fs, (fs ? d / fs : 0), (d >= 0.9 * fs ? "yes" : "no"), s, l, b,
            (d > s && d > l && d > b ? "yes" : "no")
    }' "$OUT/lora_sim_$2.csv" "$OUT/lora_sim_$3.csv" "$OUT/lora_sim_$4.csv"
}
verdict "400 TFLOP/s (the cost model)" lora lora-free-swaps lora-merged
verdict "989 TFLOP/s (H200 datasheet)" lora-989tflops lora-989tflops-free-swaps lora-989tflops-merged
echo "results: $OUT/lora_sim_*.csv ($(($(date +%s) - t0)) s)"
