#!/usr/bin/env bash
# run_lora.sh BUILD_DIR OUT_DIR: issue 46's mixed-adapter step: the 134M bench shape (Q8_0 base) with 16 LoRA adapters (F16, rank 8 on q, k, v, o, from mklora), one decode step of 16 sequences of 16 different adapters against 16 sequences of the base alone, cpu backend (the issue asks >= 0.8x the base's throughput), and whether every sequence's logits equal those it gets alone. CSV in OUT_DIR/lora.csv; ~20 s.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
mkdir -p "$OUT"
for b in bench_lora mkmodel mklora; do
    [ -x "$BUILD/$b" ] || { echo "run_lora.sh: $BUILD/$b not built (make $BUILD/$b)" >&2; exit 1; }
done
STEPS=${LORA_STEPS:-4}
REPS=${LORA_REPS:-3}
THREADS=${LORA_THREADS:-1 2}
N=16

echo "== LoRA: 134M-parameter Llama, Q8_0 (dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000), $N adapters" \
    "(F16, rank 8 on q, k, v, o), cpu backend: a decode step of $N sequences of $N adapters vs of the base alone"
m=$OUT/llama134m-q8_0.gguf
[ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type q8_0 --dim 768 --layers 12 --heads 12 \
    --kv-heads 12 --ff 2048 --vocab 32000 --ctx 2048 --seed 7 >/dev/null
list=
for i in $(seq "$N"); do
    a=$OUT/lora134m-r8-$i.gguf
    [ -f "$a" ] || "$BUILD/mklora" --base "$m" --out "$a" --rank 8 --type f16 --targets q,k,v,o --seed "$i"
    list=$list${list:+,}$a
done
csv=$OUT/lora.csv
# shellcheck disable=SC2086 # THREADS is a list
"$BUILD/bench_lora" "$m" "$list" "$STEPS" "$REPS" $THREADS > "$csv"
printf "%-8s %-16s %-16s %-22s %s\n" threads "base alone ms" "$N adapters ms" "throughput vs base" "equal alone"
bad=0
while IFS=, read -r _ th _ bms lms ratio eq; do
    printf "%-8s %-16s %-16s %-22s %s\n" "$th" "$bms" "$lms" "${ratio}x" "$eq"
    [ "$eq" = yes ] || { echo "run_lora.sh: a sequence's logits differ from its own alone" >&2; bad=1; }
    awk -v r="$ratio" 'BEGIN { exit !(r + 0 >= 0.8) }' ||
        echo "  note: ${ratio}x at $th thread(s) is below the issue's 0.8x (a noisy or loaded machine?)"
done < <(tail -n +2 "$csv")
echo "results: $csv"
exit $bad
