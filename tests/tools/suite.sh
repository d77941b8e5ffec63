# suite.sh: sourced by the test runners. suite_run NAME CMD... runs one suite with a fresh TMPDIR of
# its own and fails it when the suite leaves anything behind in that directory.
suite_run() {
    local name=$1; shift
    local tmp rc left
    tmp=$(mktemp -d "${SUITE_TMPROOT:-/tmp}/gsd-suite.XXXXXX") || return 1
    chmod 0755 "$tmp" # tests that connect as another user reach their sockets through it, as through /tmp
    TMPDIR=$tmp "$@"
    rc=$?
    left=$(find "$tmp" -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)
    if [ -n "$left" ]; then
        echo "FAIL: $name left files in its TMPDIR: $left"
        [ "$rc" -eq 0 ] && rc=1
    fi
    rm -rf "$tmp"
    return "$rc"
}
