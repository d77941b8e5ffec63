#!/usr/bin/env bash
# Runs every integration test (tests/integration/test_*.sh and test_*.py) and prints a summary line.
set -u
cd "$(dirname "$0")/../.."
export GPUSWAPD_BUILD=${GPUSWAPD_BUILD:-build}
pass=0; fail=0; failed=()
for t in tests/integration/test_*.sh tests/integration/test_*.py; do
    [ -e "$t" ] || continue
    echo "=== $t"
    case "$t" in
        *.py) /usr/bin/python3 "$t" ;;
        *) bash "$t" ;;
    esac
    if [ $? -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
for t in "${failed[@]}"; do echo "FAILED: $t"; done
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
