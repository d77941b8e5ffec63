#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU, in under 8 minutes: cuda-vs-cpu consistency on
# generated models of every weight type, page-in throughput against a plain pinned cudaMemcpyAsync,
# and swap-in time to first token of a generated 8B-shaped BF16 model. Results go to one file.
#
# Run it from the repository root. It uses an existing build/ (built here with CUDA, carried over with
# build/lib holding the shared libraries that machine lacks) or builds one when nvcc and the -dev
# packages are present.
set -uo pipefail
BUILD=${BUILD:-build}
RES=${OUT:-$BUILD}/gpu-check.txt
mkdir -p "$(dirname "$RES")"
export LD_LIBRARY_PATH="$PWD/$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log() { echo "$*" | tee -a "$RES"; }
: > "$RES"
log "gpu-check $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$RES"
if [ ! -x "$BUILD/unit_tests" ] || [ ! -x "$BUILD/bench_paging" ]; then
    log "building in $BUILD (CUDA=1)"
    make -j"$(nproc)" BUILD="$BUILD" CUDA=1 all "$BUILD/unit_tests" "$BUILD/bench_paging" >> "$RES" 2>&1 || { log "FAIL: build"; exit 1; }
fi

log "== backend consistency: cuda vs cpu"
GPUSWAPD_BUILD=$BUILD timeout 180 "$BUILD/unit_tests" --filter 'backend_cuda/*' --verbose 2>&1 | tail -40 | tee -a "$RES"
rc_cons=${PIPESTATUS[0]}

log "== page-in throughput (1.1 GB F16 model) on cuda"
m1=$BUILD/bench/llama1g-f16.gguf
mkdir -p "$BUILD/bench"
[ -f "$m1" ] || "$BUILD/mkmodel" --out "$m1" --type f16 --dim 2048 --layers 8 --heads 16 --kv-heads 16 \
    --ff 5632 --vocab 32000 --seed 5 >/dev/null
timeout 120 "$BUILD/bench_paging" "$m1" 4096 2048 0 cuda 2>&1 | tee -a "$RES"
rc_page=${PIPESTATUS[0]}

log "== swap-in time to first token, 8B-shaped BF16 model (dim 4096, 32 layers, 32/8 heads, FFN 14336, vocab 128256)"
m8=$BUILD/bench/llama8b-bf16.gguf
[ -f "$m8" ] || timeout 240 "$BUILD/mkmodel" --out "$m8" --type bf16 --dim 4096 --layers 32 --heads 32 \
    --kv-heads 8 --ff 14336 --vocab 128256 --ctx 8192 --seed 8 2>&1 | tee -a "$RES"
timeout 200 "$BUILD/bench_paging" "$m8" 20480 2048 0 cuda 2>&1 | tee -a "$RES"
rc_8b=${PIPESTATUS[0]}

log "exit codes: consistency $rc_cons, paging $rc_page, 8b $rc_8b"
[ "$rc_cons" = 0 ] && [ "$rc_page" = 0 ] && [ "$rc_8b" = 0 ]
