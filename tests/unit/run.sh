#!/usr/bin/env bash
# Runs the Criterion unit tests (tests/unit, fuzz regressions) in a fresh TMPDIR and closes with the
# `skipped: N (names and reasons)` line; usage: tests/unit/run.sh BUILD/unit_tests [criterion args].
set -u
cd "$(dirname "$0")/../.."
. tests/tools/suite.sh
bin=$1; shift
export GPUSWAPD_BUILD=${GPUSWAPD_BUILD:-build}
report=$GPUSWAPD_BUILD/unit-report.json
rm -f "$report"
suite_run unit "$bin" --jobs 2 --json="$report" "$@"
rc=$?
if [ -s "$report" ]; then
    /usr/bin/python3 tests/tools/skips.py "$report" || rc=1
else
    echo "FAIL: no unit report in $report"; rc=1
fi
exit "$rc"
