#!/usr/bin/env bash
# run.sh BUILD SECONDS NAME...: runs each libFuzzer target BUILD/fuzz_NAME for SECONDS on a fresh copy
# of tests/fuzz/corpus/NAME and regress/NAME; fails if any reports a crash, leak, timeout or UBSan
# error, leaving the inputs in BUILD/crashes/NAME/ and the output in BUILD/logs/NAME.log.
set -u
build=$1
secs=$2
shift 2
here=tests/fuzz
fail=0
for name in "$@"; do
    bin=$build/fuzz_$name
    work=$build/corpus/$name
    crashes=$build/crashes/$name
    log=$build/logs/$name.log
    rm -rf "$work" "$crashes"
    mkdir -p "$work" "$crashes" "$build/logs"
    for d in "$here/corpus/$name" "$here/regress/$name"; do
        [ -d "$d" ] && find "$d" -maxdepth 1 -type f -exec cp -t "$work" {} +
    done
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$crashes/")
    [ -f "$here/$name.dict" ] && args+=(-dict="$here/$name.dict")
    [ -f "$here/$name.args" ] && read -r -a extra < "$here/$name.args" && args+=("${extra[@]}")
    echo "fuzz $name: ${secs}s on $(ls "$work" | wc -l) inputs (log: $log)"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:handle_abort=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$bin" "${args[@]}" "$work" > "$log" 2>&1
    rc=$?
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::)' "$log" | sed "s/^/  $name: /"
    found=$(find "$crashes" -type f | wc -l)
    if [ "$rc" != 0 ] || [ "$found" != 0 ]; then
        echo "fuzz $name: FAILED (exit $rc, $found input(s) in $crashes/)"
        grep -E 'ERROR: |runtime error:|check failed|SUMMARY' "$log" | head -5 | sed 's/^/  /'
        fail=1
    else
        echo "fuzz $name: ok"
    fi
done
exit $fail
