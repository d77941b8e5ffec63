#!/usr/bin/env bash
# Runs the Criterion unit tests (tests/unit, fuzz regressions) in a fresh TMPDIR and closes with the
# `skipped: N (names and reasons)` line
# (under GPUSWAPD_UNIT_WRAP when set); usage: tests/unit/run.sh BUILD/unit_tests [criterion args].
set -u
cd "$(dirname "$0")/../.."
. tests/tools/suite.sh
bin=$1; shift
export GPUSWAPD_BUILD=${GPUSWAPD_BUILD:-build}
report=$GPUSWAPD_BUILD/unit-report.json
rm -f "$report"
# GPUSWAPD_UNIT_WRAP: a command the tests run under, e.g. "build/syscage --" (the unit's restrictions)
# shellcheck disable=SC2086
suite_run unit ${GPUSWAPD_UNIT_WRAP:-} "$bin" --jobs 2 --json="$report" "$@"
rc=$?
if [ -s "$report" ]; then
    /usr/bin/python3 tests/tools/skips.py "$report" || rc=1
else
    echo "FAIL: no unit report in $report"; rc=1
fi
exit "$rc"
