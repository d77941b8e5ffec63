#!/usr/bin/env bash
# make run: until the daemon lands, a one-shot demo of the engine on a model the project generates.
set -euo pipefail
BUILD=${1:-build}
m=$BUILD/demo/demo-f16.gguf
echo "gpuswapd demo: generated model $m (random weights, so the text is noise; the computation is real)"
"$BUILD/gpuswapd" generate --model "$m" --prompt "Once upon a time" -n 32 --temp 0.8 --seed 1
ref=${GPUSWAPD_MODELS:-../shared/models}/stories260K.gguf
if [ -f "$ref" ]; then
    echo
    echo "gpuswapd demo: the trained stories260K model ($ref), greedy:"
    "$BUILD/gpuswapd" generate --model "$ref" --prompt "Once upon a time" -n 96 --temp 0
fi
