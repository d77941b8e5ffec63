#!/usr/bin/env bash
# make bench: engine throughput on a generated 134M Llama (beside llama.cpp with LLAMA_CPP=DIR), and paging on a generated ~1 GB model (sim backend).
set -euo pipefail
BUILD=${1:-build}
OUT=$BUILD/bench
mkdir -p "$OUT"
REPS=${BENCH_REPS:-2}

bash tests/bench/run_engine.sh "$BUILD"

echo
echo "== paging: ~1.1 GB F16 model (dim 2048, 8 layers, FFN 5632, vocab 32000), sim backend, 2 MiB pages"
m=$OUT/llama1g-f16.gguf
[ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type f16 --dim 2048 --layers 8 --heads 16 \
    --kv-heads 16 --ff 5632 --vocab 32000 --seed 5 >/dev/null
pcsv=$OUT/paging.csv
"$BUILD/bench_paging" "$m" 1280 > "$pcsv"
IFS=, read -r model bytes page map_s map_gbs copy_s copy_gbs memcpy_gbs ratio \
    queue_gbs queue_ratio wall_s wall_gbs ttft_res ttft_swap ttft_cold plain_gbs _ _ _ _ < <(tail -n 1 "$pcsv")
printf "  bytes paged in:                  %s\n" "$bytes"
printf "  mapping (mmap+populate):         %s s  (%s GB/s)\n" "$map_s" "$map_gbs"
printf "  copy, during pipelined page-in:  %s s  (%s GB/s) = %sx memcpy\n" "$copy_s" "$copy_gbs" "$ratio"
printf "  copy queue alone, mapped range:  %s GB/s = %sx memcpy (%s GB/s)\n" "$queue_gbs" "$queue_ratio" "$memcpy_gbs"
printf "  copy queue alone, plain buffer:  %s GB/s\n" "$plain_gbs"
printf "  page-in wall (map+copy overlap): %s s  (%s GB/s)\n" "$wall_s" "$wall_gbs"
printf "  time to first token (8-token prompt): resident %s ms, swapped out %s ms, cold from disk %s ms\n" \
    "$ttft_res" "$ttft_swap" "$ttft_cold"

echo
echo "== paging: the same shape in Q4_K_M (bytes are bytes: the same GB/s, fewer of them)"
mq=$OUT/llama1g-q4km.gguf
[ -f "$mq" ] || "$BUILD/mkmodel" --out "$mq" --type q4_k_m --dim 2048 --layers 8 --heads 16 \
    --kv-heads 16 --ff 5632 --vocab 32000 --seed 5 >/dev/null
qcsv=$OUT/paging_q4km.csv
# alternating rounds (the machine is noisy), each type's best page-in wall time
echo "type,round,bytes,wall_s,wall_gb_s" > "$qcsv"
for r in $(seq "${BENCH_ROUNDS:-3}"); do
    for t in f16:$m q4_k_m:$mq; do
        IFS=, read -r _ b _ _ _ _ _ _ _ _ _ ws wg _ < <("$BUILD/bench_paging" "${t#*:}" 1280 --no-cold 2>/dev/null | tail -n 1)
        echo "${t%%:*},$r,$b,$ws,$wg" >> "$qcsv"
    done
done
awk -F, 'NR > 1 && (!($1 in w) || $4 < w[$1]) { w[$1] = $4; g[$1] = $5; b[$1] = $3 }
    END { printf "  F16:    %d bytes, page-in %.3f s (%.2f GB/s)\n", b["f16"], w["f16"], g["f16"]
          printf "  Q4_K_M: %d bytes, page-in %.3f s (%.2f GB/s)\n", b["q4_k_m"], w["q4_k_m"], g["q4_k_m"]
          printf "  Q4_K_M / F16: bytes %.3fx, GB/s %.2fx, page-in time %.2fx less (best of %d alternating rounds)\n",
                 b["q4_k_m"] / b["f16"], g["q4_k_m"] / g["f16"], w["f16"] / w["q4_k_m"], (NR - 1) / 2 }' "$qcsv"
echo "results: $pcsv $qcsv"

echo
echo "== service overhead: C clients over the unix socket, tiny model (dim 64, 2 layers), cpu backend, 8 tokens per request"
SD=$(realpath -m "$OUT/load") # absolute: the config's paths resolve beside it
mkdir -p "$SD"
tm=$SD/tiny.gguf
[ -f "$tm" ] || "$BUILD/mkmodel" --out "$tm" --type f32 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 \
    --vocab 320 --seed 3 >/dev/null
cat > "$SD/gpuswapd.yaml" <<CFG
listen:
  socket: $SD/s.sock
admin:
  socket: $SD/a.sock
device:
  backend: cpu
  threads: 1
scheduler:
  max_batch: 64
models:
  - name: tiny
    path: $tm
CFG
rm -f "$SD/s.sock"
"$BUILD/gpuswapd" --config "$SD/gpuswapd.yaml" 2> "$SD/daemon.log" &
dpid=$!
for _ in $(seq 100); do [ -S "$SD/s.sock" ] && break; sleep 0.05; done
lcsv=$OUT/load.csv
"$BUILD/bench_load" "$SD/s.sock" tiny "$tm" 8 ${LOAD_REQS:-40} 1 2 4 8 16 32 64 > "$lcsv"
kill -TERM $dpid 2>/dev/null; wait $dpid || true
if awk -F, 'NR > 1 && $3 > 0 { bad = 1 } END { exit !bad }' "$lcsv"; then
    echo "run.sh: requests failed in the service-overhead stage; the daemon said:" >&2
    tail -5 "$SD/daemon.log" >&2
    exit 1
fi
printf "%-8s %-10s %-10s %-10s %-10s %s\n" clients "req/s" "p50 ms" "p99 ms" errors "added p50 ms (vs a direct engine call)"
tail -n +2 "$lcsv" | while IFS=, read -r nc n err rps p50 p99 direct added; do
    printf "%-8s %-10s %-10s %-10s %-10s %s (direct %s ms)\n" "$nc" "$rps" "$p50" "$p99" "$err" "$added" "$direct"
done
echo "results: $lcsv"

echo
echo "== constrained decoding: mask + advance per step (docs/CONSTRAINED.md); real 32000-token SPM vocabulary"
BENCH_CORPUS=tests/data/schemas/jsonschemabench-sample.json "$BUILD/bench_constrain" tests/data/ggml-vocab-llama-spm.gguf 5
# the mask's share of a decode step, one thread, batch 1 and 8, on the 134M bench shape and a
# Qwen2.5-0.5B-shaped file (tied output, gpt2-style vocabulary of 151,936 generated tokens)
cm=$OUT/llama134m-q8_0.gguf
[ -f "$cm" ] || "$BUILD/mkmodel" --out "$cm" --type q8_0 --dim 768 --layers 12 --heads 12 \
    --kv-heads 12 --ff 2048 --vocab 32000 --seed 7 >/dev/null
cq=$OUT/qwen05b-shape-q8_0.gguf
[ -f "$cq" ] || "$BUILD/mkmodel" --out "$cq" --arch qwen2 --type q8_0 --dim 896 --layers 24 \
    --heads 14 --kv-heads 2 --ff 4864 --vocab 151936 --tied --seed 7 >/dev/null
for f in "$cm" "$cq"; do
    echo "-- $(basename "$f")"
    BENCH_CORPUS=tests/data/schemas/jsonschemabench-sample.json "$BUILD/bench_constrain" --model "$f" 5 1 8
done
