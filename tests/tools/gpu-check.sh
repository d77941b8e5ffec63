#!/usr/bin/env bash
# gpu-check: gpuswapd's first run on a GPU, in two calls that each fit the device's limits (one
# command, a deadline per stage, at most 3 files back) and are each useful alone:
#   call 1 (180 s): environment, CUDA unit tests, page-in correctness, paging bench
#   call 2 (240 s): environment, then the 8B-shaped model's stages (it generates the model)
# Each call leaves in $OUT (else $BUILD) its report gpu-check-N.txt (rewritten after every stage, its
# stage table and verdict last), gpu-check-N-logs.tgz (every stage's full log) and
# gpu-check-N-figures.txt (the measured figures, for tracesim --costs; the two calls' files may be
# concatenated). Exit status 0 only when every stage of the call passed.
#
#   BUILD=build-gpu bash tests/tools/gpu-check.sh --call 1|2|all    (all: both calls' stages, 420 s)
#   bash tests/tools/gpu-check.sh --dry-run [--call N]              print the plan; needs no GPU
#
# Run from the repository root on a bundle (make gpu-bundle here, then unpack it there: the README
# gives the device commands) or a build. Nothing here builds: building is not part of the boxes.
#
# For testing this script without a GPU (the report then says it is no GPU check; the dry run,
# tests/tools/gpu-dryrun.sh, does so): GPU_CHECK_BACKEND=sim runs the measuring stages on the sim
# backend, GPU_CHECK_8B / GPU_CHECK_1G ("mkmodel shape options") replace the 8B and the 1.1 GB model,
# GPU_CHECK_8B_POOL_MIB / GPU_CHECK_8B_SERVE_POOL_MIB their pools. GPUSWAPD_PLANT_CUDA_FAILURE=1 plants
# one failing assertion in the CUDA unit tests (test_backend_cuda.c).
set -uo pipefail

# name|call|box seconds|what it does (env runs first in each call)
PLAN=(
    "env|12|30|environment, from the shell before any bundled binary (uname, glibc, driver, nvidia-smi, device nodes, libcuda, cuBLAS files, whether every bundled binary's libraries load), then the backend: runtime, GPU, PCIe, VMM granularity, cuBLAS"
    "unit|1|70|CUDA unit tests (backend_cuda/*, with the MoE decode check: small generated Mixtral, Qwen2-MoE and Qwen3-MoE files, CUDA logits against cpu, and the LoRA kernel lora_mm against cpu) under GPUSWAPD_REQUIRE_CUDA=1 (a missing GPU fails them), run under syscage: the unit's MemoryDenyWriteExecute (PR_SET_MDWE and systemd 252's seccomp form) and SystemCallFilter"
    "pagein|1|25|page-in correctness, store -> VMM -> copy -> forward: swapped-in and quota-streamed passes equal a resident pass bit for bit (cuda, and sim for reference)"
    "paging|1|45|paging bench, 1.1 GB F16 model: page-in GB/s against raw copies into a VMM-mapped range and a plain cudaMalloc buffer; map vs copy GB/s"
    "ttft8b|2|135|8B-shaped BF16 model (dim 4096, 32 layers, 32/8 heads, ff 14336, vocab 128256; 16 GB): generate it, then swapped-out vs resident time to first token"
    "decode8b|2|30|decode tok/s of the 8B model at batch 1, context 128, and the fraction of the GPU's HBM roofline"
    "serve8b|2|40|the 8B model serving: decode at context 4096 for batch 8 and 32 (F16 KV caches zero-filled), tok/s and roofline fraction; prefill of 512 and 2048 tokens (512-token chunks), tok/s"
)
# a call's limit: what one device command of it may take (the boxes of its stages fit inside)
call_limit() {
    case "$1" in 1) echo 180 ;; 2) echo 240 ;; *) echo 420 ;; esac
}

BUILD=${BUILD:-build}
BE=${GPU_CHECK_BACKEND:-cuda}
M8_ARGS=${GPU_CHECK_8B:---type bf16 --dim 4096 --layers 32 --heads 32 --kv-heads 8 --ff 14336 --vocab 128256 --ctx 8192}
M1_ARGS=${GPU_CHECK_1G:---type f16 --dim 2048 --layers 8 --heads 16 --kv-heads 16 --ff 5632 --vocab 32000}
M8_POOL=${GPU_CHECK_8B_POOL_MIB:-20480}
# serve8b: the weights plus 32 F16 KV caches of 4096+16 positions (128 KiB each for the 8B shape: 16.1 GiB)
M8_SERVE_POOL=${GPU_CHECK_8B_SERVE_POOL_MIB:-40960}
M8_NAME=llama8b-bf16
[ -n "${GPU_CHECK_8B:-}" ] && M8_NAME=stand-in-$(cksum <<< "$M8_ARGS" | cut -d' ' -f1)
M1_NAME=llama1g-f16
[ -n "${GPU_CHECK_1G:-}" ] && M1_NAME=stand-in-$(cksum <<< "$M1_ARGS" | cut -d' ' -f1)
TEST_ONLY=0
{ [ "$BE" != cuda ] || [ -n "${GPU_CHECK_8B:-}" ] || [ -n "${GPU_CHECK_1G:-}" ]; } && TEST_ONLY=1
DRY=0
CALL=all
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --call) CALL=${2:-}; shift ;;
        *) echo "usage: $0 [--dry-run] [--call 1|2|all]" >&2; exit 2 ;;
    esac
    shift
done
case "$CALL" in 1|2|all) ;; *) echo "$0: --call takes 1, 2 or all, not '$CALL'" >&2; exit 2 ;; esac
TOTAL_S=$(call_limit "$CALL")
TAG=""
[ "$CALL" != all ] && TAG="-$CALL"

# the stages of this call
STAGES=()
for p in "${PLAN[@]}"; do
    IFS='|' read -r name calls _ <<< "$p"
    [ "$CALL" = all ] || [[ "$calls" == *"$CALL"* ]] && STAGES+=("$p")
done
stage_box() {
    local p
    for p in "${PLAN[@]}"; do [ "${p%%|*}" = "$1" ] && cut -d'|' -f3 <<< "$p"; done
}

box_sum=0
for p in "${STAGES[@]}"; do box_sum=$((box_sum + $(cut -d'|' -f3 <<< "$p"))); done

if [ "$DRY" = 1 ]; then
    echo "gpu-check plan, call $CALL (BUILD=$BUILD; files to ${OUT:+\$OUT=}${OUT:-$BUILD}/: gpu-check$TAG.txt, gpu-check$TAG-logs.tgz, gpu-check$TAG-figures.txt)"
    i=0
    for p in "${STAGES[@]}"; do
        i=$((i + 1))
        IFS='|' read -r name _ box what <<< "$p"
        printf "  %d. %-9s %4d s  %s\n" "$i" "$name" "$box" "$what"
    done
    printf "  total of the boxes: %d s (the call's limit %d s)\n" "$box_sum" "$TOTAL_S"
    for b in unit_tests bench_paging mkmodel beinfo syscage; do
        [ -x "$BUILD/$b" ] || echo "  note: $BUILD/$b is missing: make gpu-bundle and unpack it (or make all $BUILD/unit_tests $BUILD/bench_paging) first"
    done
    [ "$box_sum" -le "$TOTAL_S" ] || { echo "gpu-check: the boxes exceed $TOTAL_S s" >&2; exit 1; }
    exit 0
fi

RDIR=${OUT:-$BUILD}
RES=$RDIR/gpu-check$TAG.txt
FIGS=$RDIR/gpu-check$TAG-figures.txt
LOGTGZ=$RDIR/gpu-check$TAG-logs.tgz
# the logs stay beside the build (only their archive goes to $OUT: at most 3 files come back)
LOGS=$BUILD/gpu-check-logs$TAG
MODELS=${GPU_CHECK_MODELS:-$BUILD/bench}
mkdir -p "$RDIR" "$MODELS" || exit 1
rm -rf "$LOGS" && mkdir -p "$LOGS" || exit 1
export GPUSWAPD_BUILD=$BUILD
START=$SECONDS
DEADLINE=$((START + TOTAL_S))
STARTED_AT=$(date -u +%FT%TZ)

# Per stage: status (PASS, FAIL, SKIP, RUNNING, "not reached"), seconds taken, one-line summary; the body
# (figures, failures) accumulates in $BODY, the machine-readable figures in $FIGBODY.
declare -A ST_STATUS ST_TIME ST_LINE
BODY=$LOGS/report-body.txt
FIGBODY=$LOGS/figures-body.txt
: > "$BODY"
: > "$FIGBODY"
SKIP_WHY=""  # set when later stages cannot run
SKIP_HARD=0  # 1: not even the unit tests (the binaries do not load)

# fig KEY VALUE...: one figures line (tests/bench/sim/costs.c reads them; see costs.h)
fig() { echo "$*" >> "$FIGBODY"; }

write_report() {
    # (locals: bash scoping is dynamic, and run_stage, the caller, has a name and a box)
    local tmp=$RES.tmp n_pass=0 n_fail=0 n_skip=0 n_left=0 verdict p name box st
    {
        echo "gpuswapd gpu-check, call $CALL, started $STARTED_AT, BUILD=$BUILD"
        if [ "$TEST_ONLY" = 1 ]; then
            echo "  NOT A GPU CHECK: a test of this script (backend $BE; 8B model: $M8_ARGS; 1.1 GB model: $M1_ARGS)"
        fi
        [ -f "$BUILD/BUILD-INFO" ] && sed 's/^/  /' "$BUILD/BUILD-INFO"
        echo
        cat "$BODY"
        echo "stages of call $CALL (box = deadline in s; the boxes sum to $box_sum of the call's $TOTAL_S s):"
        local i=0
        for p in "${STAGES[@]}"; do
            i=$((i + 1))
            IFS='|' read -r name _ box _ <<< "$p"
            st=${ST_STATUS[$name]:-not reached}
            case "$st" in
                PASS) n_pass=$((n_pass + 1)) ;;
                FAIL | TIMEOUT) n_fail=$((n_fail + 1)) ;;
                SKIP) n_skip=$((n_skip + 1)) ;;
                *) n_left=$((n_left + 1)) ;;
            esac
            printf "  %d. %-9s %-11s %4s of %3d s  %s\n" "$i" "$name" "$st" "${ST_TIME[$name]:--}" "$box" \
                "${ST_LINE[$name]:-}"
        done
        if [ "$n_left" -gt 0 ]; then
            verdict="INCOMPLETE ($n_pass passed, $n_fail failed, $n_skip skipped, $n_left not reached yet)"
        elif [ "$n_fail" -gt 0 ] || [ "$n_skip" -gt 0 ]; then
            verdict="FAIL ($n_pass passed, $n_fail failed, $n_skip skipped)"
        else
            verdict="PASS (all ${#STAGES[@]} stages)"
        fi
        echo "verdict: call $CALL: $verdict, $((SECONDS - START)) s elapsed"
    } > "$tmp" && mv -f "$tmp" "$RES"
    {
        echo "# gpuswapd gpu-check figures, call $CALL, started $STARTED_AT (tracesim --costs reads this file; the calls' files may be concatenated)"
        [ "$TEST_ONLY" = 1 ] && echo "test_only 1"
        cat "$FIGBODY"
    } > "$FIGS.tmp" && mv -f "$FIGS.tmp" "$FIGS"
    tar -czf "$LOGTGZ.tmp" -C "$BUILD" "gpu-check-logs$TAG" 2>/dev/null && mv -f "$LOGTGZ.tmp" "$LOGTGZ"
}

note() { echo "$*" >> "$BODY"; }

# run_stage NAME FUNCTION: runs FUNCTION with STAGE_LIMIT seconds (its box, less if the call's limit
# runs short); FUNCTION sets S_STATUS and S_LINE.
run_stage() {
    local name=$1 fn=$2 box
    box=$(stage_box "$name")
    local left=$((DEADLINE - SECONDS - 4)) # room for timeout's kill-after and the report
    STAGE_LIMIT=$((box < left ? box : left))
    STAGE_T0=$SECONDS
    note "== $name (box $box s, limit $STAGE_LIMIT s)"
    echo "gpu-check: $name (limit $STAGE_LIMIT s)" >&2
    S_STATUS=FAIL
    S_LINE=""
    if [ "$STAGE_LIMIT" -lt 5 ]; then
        S_STATUS=SKIP
        S_LINE="no time left of the $TOTAL_S s"
    elif [ -n "$SKIP_WHY" ] && { [ "$SKIP_HARD" = 1 ] || { [ "$name" != unit ] && [ "$name" != pagein ]; }; }; then
        # (the unit tests still run without a device: under GPUSWAPD_REQUIRE_CUDA they fail with its reason)
        S_STATUS=SKIP
        S_LINE=$SKIP_WHY
    else
        ST_STATUS[$name]="RUNNING"  # what a run cut short during this stage shows
        write_report
        "$fn"
    fi
    ST_STATUS[$name]=$S_STATUS
    ST_TIME[$name]=$((SECONDS - STAGE_T0))
    ST_LINE[$name]=$S_LINE
    note "-> $S_STATUS: $S_LINE"
    note ""
    write_report
}

stage_left() { echo $((STAGE_T0 + STAGE_LIMIT - SECONDS)); }

# tmo LOG CMD...: CMD under what is left of the stage's limit, all output to LOG; its exit status
# (124: timed out).
tmo() {
    local log=$1 left
    shift
    left=$(stage_left)
    [ "$left" -ge 1 ] || return 124
    timeout -k 2 "$left" "$@" >> "$log" 2>&1
}

need_bins() {
    local b miss=""
    for b in "$@"; do [ -x "$BUILD/$b" ] || miss="$miss $b"; done
    [ -z "$miss" ] && return 0
    S_LINE="missing in $BUILD:$miss (make gpu-bundle and unpack it, or make all $BUILD/unit_tests $BUILD/bench_paging $BUILD/beinfo)"
    return 1
}

# ------------------------------------------------------------------ 1. environment
st_env() {
    local log=$LOGS/env.log
    : > "$log"
    # from the shell first: what a loader or driver failure of the binaries would hide
    note "host: $(uname -srm); $(ldd --version 2>&1 | head -1)"
    note "driver: $(head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'no /proc/driver/nvidia/version')"
    note "device nodes: $(find /dev -maxdepth 1 -name 'nvidia*' 2>/dev/null | sort | tr '\n' ' ')"
    note "libcuda: $( (ldconfig -p 2>/dev/null | grep -m1 'libcuda.so.1') || echo 'not in the ldconfig cache')"
    local blas
    blas=$( {
        ldconfig -p 2>/dev/null | sed -n 's/.*libcublas\.so\.13 .*=> //p'
        for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-13*; do
            ls "$d"/lib64/libcublas.so.13 "$d"/targets/*/lib/libcublas.so.13 2>/dev/null
        done
        ls /usr/lib/python3*/*-packages/nvidia/*/lib/libcublas.so.13 /usr/local/lib/python3*/*-packages/nvidia/*/lib/libcublas.so.13 \
            /opt/*/lib/python3*/site-packages/nvidia/*/lib/libcublas.so.13 /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libcublas.so.13 2>/dev/null
    } | xargs -r readlink -f | sort -u | tr '\n' ' ')
    note "cuBLAS files (libcublas.so.13) found from the shell: ${blas:-none}${GPUSWAPD_CUBLAS:+; GPUSWAPD_CUBLAS=$GPUSWAPD_CUBLAS}"
    if command -v nvidia-smi >/dev/null; then
        if tmo "$log" nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks.max.memory --format=csv; then
            grep -a -A4 '^name,' "$log" | tail -n +2 | head -4 | while IFS=, read -r name drv mem gc gm wc wm mclk; do
                note "gpu: $name, driver$drv, memory$mem, max memory clock$mclk"
                note "pcie: generation$gc now (max$gm), width x${wc# } now (max x${wm# }) (an idle link may read below its max)"
                fig "gpu $name"
            done
            grep -a -A1 '^name,' "$log" | sed -n 2p | cut -d, -f1 > "$LOGS/gpu-name.txt"
        else
            note "nvidia-smi failed: $(tail -1 "$log")"
        fi
    else
        note "nvidia-smi: not found"
    fi
    need_bins beinfo || { SKIP_WHY="no build"; SKIP_HARD=1; return; }
    # do the bundled binaries load? (a missing library or a glibc older than the bundle needs)
    local b bad=""
    for b in gpuswapd unit_tests bench_paging mkmodel beinfo syscage; do
        [ -x "$BUILD/$b" ] || continue
        ldd "$BUILD/$b" > "$LOGS/ldd-$b.txt" 2>&1
        if grep -aq 'not found\|not a dynamic\|error while loading' "$LOGS/ldd-$b.txt"; then
            bad="$bad${bad:+; }$b: $(grep -a -m1 'not found\|not a dynamic\|error while loading' "$LOGS/ldd-$b.txt" | sed 's/^[[:space:]]*//')"
        fi
    done
    if [ -n "$bad" ]; then
        note "loader: $bad"
        S_LINE="the bundled binaries do not load: $bad"
        SKIP_WHY="the bundled binaries do not load (stage env)"
        SKIP_HARD=1
        return
    fi
    note "loader: every binary's libraries resolve ($(grep -a 'needs:' "$BUILD/BUILD-INFO" 2>/dev/null || echo 'not a bundle'))"
    tmo "$log" "$BUILD/beinfo" "$BE" 256
    local rc=$?
    sed -n "s/^cuda_status: /cuda: /p; s/^cublas: /cuBLAS, as the backend finds it: /p; s/^desc: /$BE backend: /p" "$log" >> "$BODY"
    if [ "$rc" = 0 ]; then
        S_STATUS=PASS
        local gpu vers gemm
        gpu=$(sed -n 's/^desc: \([^(]*\) (.*/\1/p' "$log" | head -1)
        vers=$(sed -n 's/^desc: .*), \(driver CUDA [0-9.]*, runtime [0-9.]*\),.*/\1/p' "$log" | head -1)
        gemm=$(sed -n 's/.*prefill GEMM: //p' "$log" | head -1)
        S_LINE="$BE backend opened${gpu:+: $gpu}${vers:+, $vers}${gemm:+; prefill GEMM: $gemm}"
    elif [ "$rc" = 124 ]; then
        # a slow start (a cold driver, cuBLAS's 500 MB) is reported as such; the later stages still run
        S_STATUS=TIMEOUT
        S_LINE="beinfo did not finish within $STAGE_LIMIT s (the later stages run regardless)"
    else
        S_LINE="the $BE backend does not open (exit $rc): $(sed -n "s/^backend: $BE: not opened: //p" "$log" | head -1)$(grep -a -m1 'error while loading' "$log")"
        SKIP_WHY="no usable $BE device (stage env)"
    fi
}

# Criterion's log -> S_STATUS/S_LINE and failures into the body. A run with no test run, a failed or
# crashed test, or a non-zero exit fails; skipped tests are listed.
criterion_verdict() {
    local log=$1 rc=$2 suite=$3 syn tested passing failing crashing skips
    syn=$(grep -a 'Synthesis:' "$log" | tail -1)
    tested=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<< "$syn")
    passing=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<< "$syn")
    failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<< "$syn")
    crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<< "$syn")
    skips=$(grep -a "^\[SKIP\] $suite" "$log" | grep -vc 'Test is disabled')
    note "criterion: ${syn:-no synthesis line (cut short?)}; $skips skipped; exit $rc; full log $log"
    grep -a "^\[SKIP\] $suite" "$log" | grep -v 'Test is disabled' | cut -c1-600 | sed 's/^/  skipped: /' >> "$BODY"
    grep -a '^\[FAIL\]' "$log" | cut -c1-300 | head -40 | sed 's/^\[FAIL\] /  failed: /' >> "$BODY"
    # the distinct failed assertions, file:line and message, most frequent first. Criterion writes
    # "[----] FILE:LINE: Assertion Failed", then the message over "[----]   " lines.
    awk '/^\[----\] .*: Assertion Failed/ { if (at != "") print at ": " msg; sub(/^\[----\] /, ""); sub(/: Assertion Failed.*/, "");
             at = $0; msg = ""; next }
         at != "" && /^\[----\]/ { sub(/^\[----\] */, ""); if ($0 != "") msg = msg (msg == "" ? "" : " ") $0; next }
         at != "" { print at ": " msg; at = "" }
         END { if (at != "") print at ": " msg }' "$log" | cut -c1-800 | sort | uniq -c | sort -rn | head -8 |
        sed 's/^ *\([0-9]*\) /  assertion, \1 x: /' >> "$BODY"
    if [ "$rc" = 124 ]; then
        S_LINE="timed out after $STAGE_LIMIT s (${tested:-?} tested before)"
    elif [ -z "$tested" ] || [ "$tested" = 0 ]; then
        S_LINE="no test ran (Tested: ${tested:-no synthesis line})"
    elif [ "${failing:-1}" != 0 ] || [ "${crashing:-1}" != 0 ]; then
        S_LINE="$failing failed, $crashing crashed of $tested"
    elif [ "$rc" != 0 ] || [ "${passing:-0}" = 0 ]; then
        S_LINE="exit $rc with $passing of $tested passed"
    else
        S_STATUS=PASS
        S_LINE="$passing of $tested passed, $skips skipped"
    fi
}

# The MoE decode check's line (backend_cuda::moe_decode_*: generated MoE files decoded on cuda
# against cpu; moe_* and matmul_on_an_expert_view: the kernels MoE adds) in the report.
moe_verdict() {
    local log=$1 pass fail
    pass=$(grep -aEc '^\[PASS\] backend_cuda::(moe_|matmul_on_an_expert_view)' "$log")
    fail=$(grep -aEc '^\[(FAIL|SKIP)\] backend_cuda::(moe_|matmul_on_an_expert_view)' "$log")
    note "  mixture of experts (MoE decode check, CUDA logits vs cpu; scatter, slot sum, expert views): $pass passed, $fail failed or skipped"
}

# The LoRA line (backend_cuda::lora_mm_*: the cuda lora_mm against the cpu's over mixed segments of
# several adapters, every type; a_step_of_two_adapters_*: a pass with two adapters and the base) in
# the report.
lora_verdict() {
    local log=$1 pass fail
    pass=$(grep -aEc '^\[PASS\] backend_cuda::(lora_mm_|a_step_of_two_adapters)' "$log")
    fail=$(grep -aEc '^\[(FAIL|SKIP)\] backend_cuda::(lora_mm_|a_step_of_two_adapters)' "$log")
    note "  LoRA adapters (lora_mm: grouped low-rank products vs cpu, mixed segments and types; a pass with two adapters and the base, logits vs cpu): $pass passed, $fail failed or skipped"
}

# ------------------------------------------------------------------ 2. unit tests
# The tests run under syscage (the systemd unit's W^X and system-call filter, as the service would
# run); GPU_CHECK_NO_CAGE=1 runs them bare. When they fail caged and time is left, a bare rerun says
# whether the restrictions are the cause.
st_unit() {
    local log=$LOGS/unit.log cage=()
    : > "$log"
    need_bins unit_tests mkmodel || return
    if [ "${GPU_CHECK_NO_CAGE:-0}" = 1 ]; then
        note "unit tests without the unit's restrictions (GPU_CHECK_NO_CAGE=1)"
    elif [ -x "$BUILD/syscage" ]; then
        cage=("$BUILD/syscage" -v --in-workers --)
        tmo "$log" "$BUILD/syscage" -- "$BUILD/syscage" --probe denied denied
        local prc=$?
        sed -n 's/^probe: /  syscage probe: /p' "$log" >> "$BODY"
        [ "$prc" = 0 ] || note "  syscage probe: the restrictions did not all hold (exit $prc)"
    else
        note "skip: syscage not in $BUILD (no libseccomp-dev where it was built): unit tests ran without the unit's restrictions"
    fi
    GPUSWAPD_REQUIRE_CUDA=1 tmo "$log" "${cage[@]}" "$BUILD/unit_tests" --filter 'backend_cuda/*' --verbose --jobs 4
    local rc=$?
    grep -a '^syscage: ' "$log" | sort -u | sed 's/^/  /' >> "$BODY"
    criterion_verdict "$log" "$rc" backend_cuda
    moe_verdict "$log"
    lora_verdict "$log"
    [ "${#cage[@]}" -gt 0 ] && S_LINE="$S_LINE (under syscage)"
    if [ "$S_STATUS" != PASS ] && [ "${#cage[@]}" -gt 0 ] && [ "$rc" != 124 ] && [ "$(stage_left)" -ge 20 ]; then
        local blog=$LOGS/unit-bare.log syn
        : > "$blog"
        GPUSWAPD_REQUIRE_CUDA=1 tmo "$blog" "$BUILD/unit_tests" --filter 'backend_cuda/*' --verbose --jobs 4
        local brc=$?
        syn=$(grep -a 'Synthesis:' "$blog" | tail -1)
        note "rerun without syscage (exit $brc): ${syn:-no synthesis line}; log $blog"
        S_LINE="$S_LINE; without syscage: ${syn#*Synthesis: }"
    fi
}

# ------------------------------------------------------------------ 3. page-in correctness
st_pagein() {
    local log=$LOGS/pagein.log
    : > "$log"
    need_bins unit_tests mkmodel || return
    GPUSWAPD_REQUIRE_CUDA=1 tmo "$log" "$BUILD/unit_tests" --filter '*/swapped_in*' --verbose --jobs 2
    local rc=$?
    criterion_verdict "$log" "$rc" ''
    local cu
    cu=$(grep -ac '^\[PASS\] backend_cuda::swapped_in' "$log")
    if [ "$S_STATUS" = PASS ] && [ "$cu" -lt 2 ]; then
        S_STATUS=FAIL
        S_LINE="the cuda page-in tests did not both pass ($cu of 2)"
    fi
}

# CSV helpers: field NAME of the last line of a bench CSV (header first).
csv_get() {
    awk -F, -v k="$2" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { last = $0 } END { split(last, f, ","); if (k in col) print f[col[k]] }' "$1"
}

# 1 if every named field is a finite positive number.
csv_finite() {
    local csv=$1 k v
    shift
    for k in "$@"; do
        v=$(csv_get "$csv" "$k")
        awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }' || { echo "$k=$v"; return 1; }
    done
    return 0
}

mk8b() {
    local m=$MODELS/$M8_NAME.gguf log=$1
    if [ -f "$m" ]; then
        note "model: $m exists (written whole: mkmodel writes to .part first), reused"
        return 0
    fi
    local t0=$SECONDS
    # shellcheck disable=SC2086
    tmo "$log" "$BUILD/mkmodel" --out "$m.part" $M8_ARGS --seed 8
    local rc=$?
    if [ "$rc" != 0 ]; then
        rm -f "$m.part"
        S_LINE="mkmodel of the 8B file failed (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))"
        return 1
    fi
    mv -f "$m.part" "$m"
    note "model: generated $m in $((SECONDS - t0)) s ($(df -h "$MODELS" | awk 'NR == 2 { print $4 }') left on its disk)"
}

# ------------------------------------------------------------------ 4. paging bench
st_paging() {
    local log=$LOGS/paging.log csv=$LOGS/paging.csv m=$MODELS/$M1_NAME.gguf
    : > "$log"
    need_bins bench_paging mkmodel || return
    if [ ! -f "$m" ]; then
        # shellcheck disable=SC2086
        tmo "$log" "$BUILD/mkmodel" --out "$m.part" $M1_ARGS --seed 5 || { rm -f "$m.part"; S_LINE="mkmodel failed"; return; }
        mv -f "$m.part" "$m"
    fi
    tmo "$log" "$BUILD/bench_paging" "$m" 4096 2048 0 "$BE"
    local rc=$?
    grep -a -A1 '^model,' "$log" > "$csv"
    if [ "$rc" != 0 ]; then
        S_LINE="bench_paging exit $rc$([ "$rc" = 124 ] && echo ', timed out'): $(grep -a 'bench_paging:' "$log" | grep -v 'backend:' | tail -1)"
        return
    fi
    local bad
    if ! bad=$(csv_finite "$csv" pagein_gb_s queue_gb_s raw_plain_gb_s map_gb_s copy_gb_s); then
        S_LINE="a figure is not a finite positive number: $bad"
        return
    fi
    local pg raw rawp map cp
    pg=$(csv_get "$csv" pagein_gb_s); raw=$(csv_get "$csv" queue_gb_s); rawp=$(csv_get "$csv" raw_plain_gb_s)
    map=$(csv_get "$csv" map_gb_s); cp=$(csv_get "$csv" copy_gb_s)
    note "model: $(csv_get "$csv" bytes) bytes, 2 MiB pages"
    note "page-in wall (map + copy overlapped): $pg GB/s = $(csv_get "$csv" pagein_vs_raw_mapped)x a raw copy into the VMM-mapped range ($raw GB/s), $(csv_get "$csv" pagein_vs_raw_plain)x a raw copy into a cudaMalloc buffer ($rawp GB/s)"
    note "mapping alone: $map GB/s; copies during the page-in: $cp GB/s"
    note "time to first token (8 tokens): resident $(csv_get "$csv" ttft_resident_ms) ms, swapped out $(csv_get "$csv" ttft_swapped_ms) ms, cold $(csv_get "$csv" ttft_cold_ms) ms"
    fig "pagein_1g_gb_s $pg"
    fig "raw_copy_gb_s $raw $rawp"
    S_STATUS=PASS
    S_LINE="page-in $pg GB/s; raw copy $raw GB/s mapped, $rawp GB/s plain; map $map GB/s, copy $cp GB/s"
}

# ------------------------------------------------------------------ 5. 8B time to first token
st_ttft8b() {
    local log=$LOGS/ttft8b.log csv=$LOGS/ttft8b.csv m=$MODELS/$M8_NAME.gguf
    : > "$log"
    need_bins bench_paging mkmodel || return
    mk8b "$log" || return
    tmo "$log" "$BUILD/bench_paging" "$m" "$M8_POOL" 2048 0 "$BE" --no-cold
    local rc=$?
    grep -a -A1 '^model,' "$log" > "$csv"
    if [ "$rc" != 0 ]; then
        S_LINE="bench_paging exit $rc$([ "$rc" = 124 ] && echo ', timed out'): $(grep -a 'bench_paging:' "$log" | grep -v 'backend:' | tail -1)"
        return
    fi
    local bad
    if ! bad=$(csv_finite "$csv" ttft_resident_ms ttft_swapped_ms pagein_gb_s queue_gb_s raw_plain_gb_s); then
        S_LINE="a figure is not a finite positive number: $bad"
        return
    fi
    local res sw pg
    res=$(csv_get "$csv" ttft_resident_ms); sw=$(csv_get "$csv" ttft_swapped_ms); pg=$(csv_get "$csv" pagein_gb_s)
    note "8B BF16, $(csv_get "$csv" bytes) bytes: time to first token (8-token prompt) resident $res ms, swapped out $sw ms"
    note "page-in $pg GB/s (raw copy $(csv_get "$csv" queue_gb_s) GB/s mapped, $(csv_get "$csv" raw_plain_gb_s) GB/s plain), map $(csv_get "$csv" map_gb_s) GB/s"
    fig "pagein_8b_gb_s $pg"
    fig "model_8b_bytes $(csv_get "$csv" bytes)"
    fig "ttft_8b_ms $res $sw"
    S_STATUS=PASS
    S_LINE="TTFT resident $res ms, swapped out $sw ms (page-in $pg GB/s)"
}

# Peak HBM bandwidth in GB/s: a table by name, else what the cuda backend derived (clock x width).
peak_gbs() {
    local name=$1 desc
    case "$name" in
        *H200*) echo 4800 ;;
        *H100*PCIe*) echo 2000 ;;
        *H100*NVL*) echo 3900 ;;
        *H100*) echo 3350 ;;
        *A100*80GB*PCIe*|*A100-PCIE-80GB*) echo 1935 ;;
        *A100*80GB*) echo 2039 ;;
        *A100*) echo 1555 ;;
        *L40S*) echo 864 ;;
        *)
            desc=$(sed -n 's/.*peak memory bandwidth \([0-9.]*\) GB\/s.*/\1/p' "$LOGS/env.log" 2>/dev/null | head -1)
            awk -v p="${desc:-0}" 'BEGIN { if (p + 0 > 0) print p }'  # 0: the device did not say
            ;;
    esac
}

# ------------------------------------------------------------------ 6. 8B decode
st_decode8b() {
    local log=$LOGS/decode8b.log csv=$LOGS/decode8b.csv m=$MODELS/$M8_NAME.gguf
    : > "$log"
    need_bins bench_paging || return
    [ -f "$m" ] || { S_STATUS=SKIP; S_LINE="no 8B model file (stage ttft8b)"; return; }
    tmo "$log" "$BUILD/bench_paging" "$m" "$M8_POOL" 2048 0 "$BE" --decode 64 --decode-only
    local rc=$?
    grep -a -A1 '^model,' "$log" > "$csv"
    if [ "$rc" != 0 ]; then
        S_LINE="bench_paging exit $rc$([ "$rc" = 124 ] && echo ', timed out'): $(grep -a 'bench_paging:' "$log" | grep -v 'backend:' | tail -1)"
        return
    fi
    local bad
    if ! bad=$(csv_finite "$csv" decode_tok_s decode_bytes_per_tok decode_gb_s); then
        S_LINE="a figure is not a finite positive number: $bad"
        return
    fi
    local tok bpt gbs name peak
    tok=$(csv_get "$csv" decode_tok_s); bpt=$(csv_get "$csv" decode_bytes_per_tok); gbs=$(csv_get "$csv" decode_gb_s)
    name=$(cat "$LOGS/gpu-name.txt" 2>/dev/null)
    peak=$(peak_gbs "$name")
    note "decode, batch 1, context 128: $tok tok/s, $bpt bytes read per token = $gbs GB/s"
    fig "decode 1 128 $tok $bpt"
    S_STATUS=PASS
    if [ -n "$peak" ]; then
        local frac roof
        frac=$(awk -v g="$gbs" -v p="$peak" 'BEGIN { printf "%.2f", g / p }')
        roof=$(awk -v p="$peak" -v b="$bpt" 'BEGIN { printf "%.0f", p * 1e9 / b }')
        note "HBM roofline of ${name:-this GPU}: $peak GB/s -> $roof tok/s; measured $frac of it"
        S_LINE="$tok tok/s = $gbs GB/s = $frac of the $peak GB/s roofline"
    else
        S_LINE="$tok tok/s = $gbs GB/s (no peak bandwidth known for '${name:-?}': no roofline fraction)"
    fi
}

# ------------------------------------------------------------------ 7. 8B serving: long-context decode, prefill
st_serve8b() {
    local log=$LOGS/serve8b.log csv=$LOGS/serve8b.csv m=$MODELS/$M8_NAME.gguf
    : > "$log"
    need_bins bench_paging || return
    [ -f "$m" ] || { S_STATUS=SKIP; S_LINE="no 8B model file (stage ttft8b)"; return; }
    tmo "$log" "$BUILD/bench_paging" "$m" "$M8_SERVE_POOL" 2048 0 "$BE" --serving 16
    local rc=$?
    grep -a -A4 '^model,bytes,kind,' "$log" | grep -a -v -- '^--' > "$csv"
    local name peak parts="" row kind b tok tps bpt gbs frac
    name=$(cat "$LOGS/gpu-name.txt" 2>/dev/null)
    peak=$(peak_gbs "$name")
    # every row that came back is reported, also when a later one timed out
    while IFS=, read -r _ _ kind b tok tps bpt gbs; do
        awk -v v="$tps" 'BEGIN { exit !(v ~ /^[0-9.eE+-]+$/ && v + 0 > 0) }' || {
            S_LINE="a figure is not a finite positive number: $kind batch $b tokens $tok tok_s=$tps"; return; }
        if [ "$kind" = decode ]; then
            frac=""
            [ -n "$peak" ] && frac=$(awk -v g="$gbs" -v p="$peak" 'BEGIN { printf "%.2f", g / p }')
            note "decode, batch $b, context $tok: $tps tok/s, $bpt bytes read per token = $gbs GB/s${frac:+ = $frac of the $peak GB/s roofline}"
            fig "decode $b $tok $tps $bpt"
            parts="$parts${parts:+; }decode b$b ctx$tok $tps tok/s${frac:+ ($frac roofline)}"
        else
            note "prefill of $tok tokens: $tps tok/s"
            fig "prefill $tok $tps"
            parts="$parts${parts:+; }prefill $tok $tps tok/s"
        fi
    done < <(tail -n +2 "$csv")
    row=$(($(wc -l < "$csv") - 1))
    if [ "$rc" != 0 ] || [ "$row" -lt 4 ]; then
        S_LINE="bench_paging exit $rc$([ "$rc" = 124 ] && echo ', timed out'), $((row < 0 ? 0 : row)) of 4 figures${parts:+: $parts}$(grep -a 'bench_paging:' "$log" | grep -v 'backend:' | tail -1 | sed 's/^/; /')"
        return
    fi
    S_STATUS=PASS
    S_LINE=$parts
}

write_report
for p in "${STAGES[@]}"; do
    name=${p%%|*}
    run_stage "$name" "st_$name"
done
echo "gpu-check: report in $RES, figures in $FIGS, logs in $LOGTGZ" >&2
# the verdict table is the report's end: the last thing printed
cat "$RES"
grep -q '^verdict: call [^:]*: PASS' "$RES"
