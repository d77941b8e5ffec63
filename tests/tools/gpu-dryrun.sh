#!/usr/bin/env bash
# gpu-dryrun: both gpu-check device calls, exactly as the README writes them, on the sim backend with
# stand-in models, inside the device's limits, failing on any breach:
#   - what travels (the files `git ls-files -co --exclude-standard` lists, plus the carried archive)
#     is at most 60 MiB, and the calls run on a copy of just that;
#   - each call ends within its limit (180 s and 240 s) and leaves at most 3 files in $OUT, named as
#     the device brings them back, none over 16 MiB;
#   - its verdict table is within the last 12,000 characters of its output, every stage in it;
#   - call 1, with GPUSWAPD_PLANT_CUDA_FAILURE=1, shows the planted assertion's text and file:line;
#   - every bundled binary, with LD_LIBRARY_PATH empty, resolves every library inside the bundle
#     or to glibc's own;
#   - tracesim --costs reads each call's figures file, and both together;
#   - make gpu-check with neither a bundle nor the libraries stops at once, saying what to do;
#   - a bundled binary needing a library the machine lacks: the environment stage names it.
#
#   bash tests/tools/gpu-dryrun.sh [ARCHIVE]     (default build-carry/gpu-bundle.tar.xz: make gpu-bundle)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCHIVE=${1:-build-carry/gpu-bundle.tar.xz}
CARRY_DIR=$(dirname "$ARCHIVE")
SIM=${GPUSWAPD_BUILD:-build}/tracesim
MAX_MIB=60
MAX_FILES=3
TAIL_CHARS=12000
fails=0
ok() { echo "ok   $*"; }
bad() {
    echo "FAIL $*"
    fails=$((fails + 1))
}

[ -f "$ARCHIVE" ] || { echo "FAIL no bundle at $ARCHIVE (make gpu-bundle)"; exit 1; }
root=$(mktemp -d "${TMPDIR:-/tmp}/gsd-gpudry.XXXXXX") || exit 1
trap 'rm -rf "$root"' EXIT
dev=$root/device
mkdir -p "$dev" "$root/out"

# 1. what travels: the working tree as the device copies it, and the carried folder
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dev" 2>/dev/null
mkdir -p "$dev/$CARRY_DIR" && cp "$ARCHIVE" "$dev/$CARRY_DIR/"
bytes=$(cd "$dev" && find . -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$bytes" -le $((MAX_MIB * 1048576)) ]; then ok "travels: $mib MiB (at most $MAX_MIB)"; else
    bad "travels: $mib MiB, over $MAX_MIB MiB"; fi

# the device commands, from the README
readme_cmd() {
    awk -v m="<!-- gpu-call-$1 -->" '$0 == m { on = 1; next } on && /^```sh/ { code = 1; next }
        code && /^```/ { exit } code { print }' README.md
}

# stand-ins: small shapes in the models' places, the sim backend for the cuda one
export GPU_CHECK_BACKEND=sim
export GPU_CHECK_8B="--type bf16 --dim 256 --layers 4 --heads 8 --kv-heads 2 --ff 512 --vocab 1024 --ctx 8192"
export GPU_CHECK_1G="--type f16 --dim 512 --layers 4 --heads 8 --kv-heads 8 --ff 1024 --vocab 4096"
export GPU_CHECK_8B_POOL_MIB=256 GPU_CHECK_8B_SERVE_POOL_MIB=1024

for call in 1 2; do
    cmd=$(readme_cmd "$call")
    [ -n "$cmd" ] || { bad "call $call: no <!-- gpu-call-$call --> command in README.md"; continue; }
    limit=$(bash tests/tools/gpu-check.sh --dry-run --call "$call" | sed -n "s/.*the call's limit \([0-9]*\) s.*/\1/p")
    [ -n "$limit" ] || { bad "call $call: gpu-check.sh --dry-run names no limit"; continue; }
    out=$root/out/$call
    log=$root/call-$call.log
    mkdir -p "$out"
    plant=
    [ "$call" = 1 ] && plant=1
    t0=$(date +%s.%N)
    (cd "$dev" && OUT=$out GPUSWAPD_PLANT_CUDA_FAILURE=$plant timeout -k 5 "$limit" bash -c "$cmd") > "$log" 2>&1
    rc=$?
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "---- call $call: \`$cmd\` (rc $rc, $took s of $limit s); output's last lines:"
    tail -n 14 "$log" | sed 's/^/    /'
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then bad "call $call: ran past its $limit s"; else
        ok "call $call: ended in $took s (limit $limit s, exit $rc)"; fi

    # files back: at most 3, named as the device brings them back, none over 16 MiB
    nfiles=$(find "$out" -type f | wc -l)
    [ "$nfiles" -le "$MAX_FILES" ] && ok "call $call: $nfiles files in \$OUT" ||
        bad "call $call: $nfiles files in \$OUT (at most $MAX_FILES): $(cd "$out" && find . -type f | tr '\n' ' ')"
    badname=$(cd "$out" && find . -mindepth 1 | sed 's|^\./||' | grep -Ev '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$')
    [ -z "$badname" ] && ok "call $call: names and depths come back" || bad "call $call: would not come back: $badname"
    big=$(find "$out" -type f -size +16M)
    [ -z "$big" ] || bad "call $call: over 16 MiB: $big"
    for f in "gpu-check-$call.txt" "gpu-check-$call-logs.tgz" "gpu-check-$call-figures.txt"; do
        [ -s "$out/$f" ] || bad "call $call: no $f in \$OUT"
    done
    tar -tzf "$out/gpu-check-$call-logs.tgz" > /dev/null 2>&1 || bad "call $call: the logs archive does not read"

    # the verdict table within the last 12,000 characters of the output, every stage in it
    tail -c "$TAIL_CHARS" "$log" > "$root/tail"
    if grep -q "^verdict: call $call: \(PASS\|FAIL\)" "$root/tail" && grep -q "^stages of call $call" "$root/tail"; then
        ok "call $call: $(grep "^verdict:" "$root/tail" | tail -1)"
    else
        bad "call $call: no stage table and final verdict in the last $TAIL_CHARS characters"
    fi
    stages=$(bash tests/tools/gpu-check.sh --dry-run --call "$call" | sed -n 's/^ *[0-9]*\. \([a-z0-9]*\) .*/\1/p')
    for s in $stages; do
        row=$(sed -n "/^stages of call $call/,\$p" "$root/tail" | grep -E "^ *[0-9]+\. $s ")
        case "$row" in
            *"not reached"* | *RUNNING* | "") bad "call $call: stage $s did not finish: ${row:-no row}" ;;
        esac
    done
    rep=$out/gpu-check-$call.txt
    grep -q "NOT A GPU CHECK" "$rep" || bad "call $call: the report does not say it is no GPU check"
    for k in "host: " "driver: " "cuBLAS files" "loader: every binary's libraries resolve"; do
        grep -q "^$k" "$rep" && ok "call $call: env says '$k'" || bad "call $call: env lacks '$k'"
    done
done

# 2. the planted assertion: its text and file:line, not a skip reason
rep1=$root/out/1/gpu-check-1.txt
line=$(grep -n 'GPUSWAPD_PLANT_CUDA_FAILURE=1): the report must show' tests/unit/test_backend_cuda.c | cut -d: -f1)
if [ -f "$rep1" ] && grep -q "assertion, .*tests/unit/test_backend_cuda.c:$((line - 1)): planted failure (GPUSWAPD_PLANT_CUDA_FAILURE=1): the report must show this text" "$rep1"; then
    ok "call 1: the planted assertion, with test_backend_cuda.c:$((line - 1)), is in the report"
else
    bad "call 1: the planted assertion (test_backend_cuda.c:$((line - 1))) is not in the report:"
    grep -a 'assertion' "$rep1" 2>/dev/null | head -5 | sed 's/^/    /'
fi
# and without a GPU the unit tests' own reason is there too, with file:line
grep -q "assertion, .*test_backend_cuda.c:[0-9]*: GPUSWAPD_REQUIRE_CUDA is set but CUDA is unusable" "$rep1" &&
    ok "call 1: the no-GPU reason, with file:line, is in the report" || bad "call 1: the no-GPU reason is not in the report"

# 3. the bundled binaries' libraries: inside the bundle or glibc's own, with LD_LIBRARY_PATH empty
GLIBC_RX='^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|/(usr/)?lib/x86_64-linux-gnu/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64)\.so\.[0-9.]+)$'
bundle=$dev/build-gpu
if [ -d "$bundle" ]; then
    for b in "$bundle"/*; do
        [ -f "$b" ] && [ -x "$b" ] || continue
        res=$(LD_LIBRARY_PATH= ldd "$b" 2>&1)
        stray=$(awk '/not found/ { print; next } /=> \// { print $3; next } /^\t\// { print $1 }' <<< "$res" |
            grep -v "^$bundle/lib/" | grep -Ev "$GLIBC_RX")
        if [ -z "$stray" ]; then ok "bundle: $(basename "$b"): $(grep -c "$bundle/lib/" <<< "$res") libraries from the bundle, the rest glibc's"; else
            bad "bundle: $(basename "$b") resolves outside the bundle: $(tr '\n' ' ' <<< "$stray")"; fi
    done
    LD_LIBRARY_PATH= "$bundle/beinfo" sim 16 > /dev/null 2>&1 && ok "bundle: beinfo runs with LD_LIBRARY_PATH empty" ||
        bad "bundle: beinfo does not run with LD_LIBRARY_PATH empty"
else
    bad "bundle: the README's call did not unpack build-gpu/"
fi

# 4. the figures files: each alone, both as a list and concatenated
f1=$root/out/1/gpu-check-1-figures.txt f2=$root/out/2/gpu-check-2-figures.txt
cat "$f1" "$f2" > "$root/both.txt" 2>/dev/null
for spec in "$f1:1 of 4" "$f2:4 of 4" "$f1,$f2:4 of 4" "$root/both.txt:4 of 4"; do
    files=${spec%:*} want=${spec##*:}
    if "$SIM" --costs "$files" --print-costs > "$root/costs.out" 2> "$root/costs.err" &&
        grep -q "$want figures measured" "$root/costs.err" && grep -q "NOT A GPU CHECK" "$root/costs.err"; then
        ok "tracesim --costs $(basename "${files%%,*}")${files//[^,]/}: $want figures measured"
    else
        bad "tracesim --costs $files: want '$want figures measured':"
        sed 's/^/    /' "$root/costs.err"
    fi
done

# 5. make gpu-check with neither a bundle nor the libraries: a message at once, not a build
t0=$(date +%s.%N)
timeout 20 make -s --no-print-directory gpu-check GPU_BUILD="$root/none" GPU_ARCHIVE="$root/none.tar.xz" \
    PKGS=gpuswapd-no-such-library > "$root/make.out" 2>&1
rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ "$rc" = 2 ] && grep -q "make gpu-bundle" "$root/make.out" && awk -v t="$took" 'BEGIN { exit !(t < 2) }'; then
    ok "make gpu-check with nothing to run: exit 2 in $took s: $(head -c 160 "$root/make.out")..."
else
    bad "make gpu-check with nothing to run: exit $rc in $took s:"
    sed 's/^/    /' "$root/make.out"
fi

# 6. a bundle whose binary needs a library the machine lacks (patchelf adds one no machine has):
#    the environment stage names the loader failure, and nothing else runs
if [ -x "$dev/build-gpu/beinfo" ]; then
    patchelf --add-needed libgpuswapd-absent.so.1 "$dev/build-gpu/beinfo"
    mkdir -p "$root/out/broken"
    (cd "$dev" && OUT=$root/out/broken BUILD=build-gpu timeout 60 bash tests/tools/gpu-check.sh --call 1) > "$root/broken.log" 2>&1
    rep=$root/out/broken/gpu-check-1.txt
    if grep -q "env .*FAIL .*the bundled binaries do not load: beinfo: libgpuswapd-absent.so.1 => not found" "$rep" 2>/dev/null &&
        grep -q "unit .*SKIP .*the bundled binaries do not load" "$rep"; then
        ok "a binary needing a missing library: env names it, the later stages are skipped for it"
    else
        bad "a binary needing a missing library: the report does not name the loader failure:"
        tail -8 "$rep" 2>/dev/null | sed 's/^/    /'
    fi
fi

echo "gpu-dryrun: $fails failed"
[ "$fails" = 0 ]
