#!/usr/bin/env bash
# make bench: engine throughput on a generated 134M-parameter Llama (dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000).
set -euo pipefail
BUILD=${1:-build}
OUT=$BUILD/bench
mkdir -p "$OUT"
csv=$OUT/engine.csv
echo "model,type,threads,isa,prefill_tok_s,decode_tok_s" > "$csv"
for t in f32 f16 q8_0; do
    m=$OUT/llama134m-$t.gguf
    [ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type $t --dim 768 --layers 12 --heads 12 \
        --kv-heads 12 --ff 2048 --vocab 32000 --ctx 2048 --seed 7 >/dev/null
    "$BUILD/bench_engine" "$m" 128 32 ${BENCH_REPS:-2} 1 2 | tee -a "$csv"
done
echo
echo "Engine, 134M-parameter Llama, prefill = 128-token prompt, decode = 32 tokens after it (best of ${BENCH_REPS:-2}):"
printf "%-6s %-8s %-16s %-16s\n" type threads "prefill tok/s" "decode tok/s"
tail -n +2 "$csv" | while IFS=, read -r model type th isa pf dc; do
    printf "%-6s %-8s %-16s %-16s\n" "$type" "$th" "$pf" "$dc"
done
echo "results: $csv"
