#!/usr/bin/env bash
# The trace-driven simulator's self-test: determinism, Belady bound, no pool over-commit.
set -euo pipefail
"${GPUSWAPD_BUILD:-build}/tracesim" --self-test
