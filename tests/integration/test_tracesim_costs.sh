#!/usr/bin/env bash
# tracesim --costs: the H200 datasheet figures; gpu-check figures files' measured ones (one from gpu-check.sh's GPU_CHECK_BACKEND=sim test mode, and synthetic ones whose figures follow a known cost model the fit must recover, the two calls' files given as a list and concatenated); the datasheet for what a file lacks.
set -uo pipefail
cd "$(dirname "$0")/../.."
SIM="${GPUSWAPD_BUILD:-build}/tracesim"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gsd-costs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0

# check NAME OUTPUT KEY WANT TOLERANCE: the key=value of --print-costs within a relative tolerance
check() {
    local name=$1 out=$2 key=$3 want=$4 tol=$5 got
    got=$(tr ' ' '\n' <<< "$out" | sed -n "s/^$key=//p")
    if awk -v g="$got" -v w="$want" -v t="$tol" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(g != "" && d <= t * (w < 0 ? -w : w) + 1e-9) }'; then
        echo "ok   $name: $key=$got"
    else
        echo "FAIL $name: $key=$got, want $want (within $tol)"
        fails=$((fails + 1))
    fi
}

# has NAME FILE PATTERN: stderr said it
has() {
    if grep -q -- "$3" "$2"; then echo "ok   $1: says '$3'"; else
        echo "FAIL $1: stderr lacks '$3':"; sed 's/^/    /' "$2"; fails=$((fails + 1)); fi
}

# 1. the datasheet
out=$("$SIM" --costs h200 --print-costs 2> "$tmp/err") || { echo "FAIL h200: exit $?"; exit 1; }
check h200 "$out" h2d_gbs 55 0
check h200 "$out" hbm_gbs 4800 0
check h200 "$out" tflops 989 0
has h200 "$tmp/err" "0 of 4 figures measured"

# 2. a figures file in gpu-check's own format: tests/data/gpu-check-sim-figures.txt (gpu-check.sh's
#    GPU_CHECK_BACKEND=sim test mode: CPU figures of the sim backend, not a GPU's)
out=$("$SIM" --costs tests/data/gpu-check-sim-figures.txt --print-costs 2> "$tmp/err") || { echo "FAIL sim figures: exit $?"; exit 1; }
check "sim figures" "$out" h2d_gbs 2.84 0.001  # the ttft8b stage's page-in, not paging's 1.19
has "sim figures" "$tmp/err" "4 of 4 figures measured"
has "sim figures" "$tmp/err" "NOT A GPU CHECK"
has "sim figures" "$tmp/err" "prefill of 512 tokens"

# 3. synthetic figures in the same format, the two calls' files apart, made from step = 0.2 ms +
#    bytes / 4000 GB/s + 0.01 ms x batch and prefill at 600 TFLOP/s (not measured: the fit must
#    recover them)
cat > "$tmp/call1.txt" <<'EOT'
# gpuswapd gpu-check figures, call 1, started 2026-12-03T00:00:00Z
gpu Synthetic H200
pagein_1g_gb_s 48.0
raw_copy_gb_s 53.0 53.0
EOT
cat > "$tmp/call2.txt" <<'EOT'
# gpuswapd gpu-check figures, call 2, started 2026-12-03T00:05:00Z
gpu Synthetic H200
pagein_8b_gb_s 51.5
model_8b_bytes 16060000000
ttft_8b_ms 20.0 330.0
decode 1 128 236.1 16100000000
decode 8 4096 1490.1 2544370912
decode 32 4096 3624.0 1038745912
prefill 512 20000.0
prefill 2048 34686.5
EOT
for spec in "$tmp/call1.txt,$tmp/call2.txt" "$tmp/both.txt"; do
    cat "$tmp/call1.txt" "$tmp/call2.txt" > "$tmp/both.txt"
    out=$("$SIM" --costs "$spec" --print-costs 2> "$tmp/err") || { echo "FAIL synthetic: exit $?"; exit 1; }
    check synthetic "$out" h2d_gbs 51.5 0.001
    # three points leave KV reads (bytes) and per-token time nearly collinear (at context 4096 both
    # grow with the batch), and the figures carry 4-5 digits: the split is loose, the step times tight
    check synthetic "$out" hbm_gbs 4000 0.02
    check synthetic "$out" t_step_ms 0.2 0.15
    check synthetic "$out" t_token_ms 0.01 0.15
    has synthetic "$tmp/err" "worst step time off by 0.0%"
    check synthetic "$out" t_fixed_ms 0 0
    check synthetic "$out" tflops 600 0.02
    has synthetic "$tmp/err" "on Synthetic H200"
done

# 4. call 1 alone (the 8B stages not run): page-in measured, the rest from the datasheet
out=$("$SIM" --costs "$tmp/call1.txt" --print-costs 2> "$tmp/err") || { echo "FAIL short: exit $?"; exit 1; }
check short "$out" h2d_gbs 48 0.001
check short "$out" hbm_gbs 4800 0
check short "$out" tflops 989 0
has short "$tmp/err" "1 of 4 figures measured"
has short "$tmp/err" "HBM 4800 GB/s: datasheet"

# 5. a missing report is an error
if "$SIM" --costs "$tmp/none.txt" --print-costs 2> "$tmp/err"; then
    echo "FAIL missing report: exit 0"; fails=$((fails + 1))
else has "missing report" "$tmp/err" "none.txt"; fi
if "$SIM" --costs "$tmp/call1.txt,,x" --print-costs 2> "$tmp/err"; then
    echo "FAIL empty path in the list: exit 0"; fails=$((fails + 1))
else has "empty path" "$tmp/err" "empty or overlong path"; fi
[ "$fails" = 0 ]
