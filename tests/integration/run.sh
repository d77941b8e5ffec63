#!/usr/bin/env bash
# Runs every integration test (tests/integration/test_*.sh and test_*.py), each in a fresh TMPDIR that
# must be empty when it ends, and closes with the skipped line and a summary line.
set -u
cd "$(dirname "$0")/../.."
. tests/tools/suite.sh
export GPUSWAPD_BUILD=${GPUSWAPD_BUILD:-build}
logs=$(mktemp -d "${TMPDIR:-/tmp}/gsd-integration.XXXXXX")
pass=0; fail=0; failed=()
: > "$logs/skips"
for t in tests/integration/test_*.sh tests/integration/test_*.py; do
    [ -e "$t" ] || continue
    echo "=== $t"
    case "$t" in
        *.py) cmd=(/usr/bin/python3 "$t") ;;
        *) cmd=(bash "$t") ;;
    esac
    suite_run "$t" "${cmd[@]}" 2>&1 | tee "$logs/out"
    rc=${PIPESTATUS[0]}
    # a test says `skip: reason` (indented or not) for each part it could not run
    sed -nE "s/^[[:space:]]*skip:?[[:space:]]*(.*)$/$(basename "$t")\t\1/p" "$logs/out" >> "$logs/skips"
    if [ "$rc" -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
/usr/bin/python3 tests/tools/skips.py - < "$logs/skips" || { fail=$((fail+1)); failed+=("(skip kinds)"); }
rm -rf "$logs"
for t in "${failed[@]}"; do echo "FAILED: $t"; done
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
