#!/usr/bin/env bash
# The gpu-check device calls, as the README writes them, on the sim backend inside the device's
# limits (tests/tools/gpu-dryrun.sh says which); needs the bundle make test builds (make gpu-bundle).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ ! -f build-carry/gpu-bundle.tar.xz ] && ! command -v nvcc > /dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "skip: nvcc not installed: no GPU bundle to carry"
    exit 0
fi
exec bash tests/tools/gpu-dryrun.sh build-carry/gpu-bundle.tar.xz
