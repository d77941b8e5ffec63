#!/usr/bin/env bash
# tracesim --costs: the H200 datasheet figures; a gpu-check report's measured ones (a report from gpu-check.sh's GPU_CHECK_BACKEND=sim test mode, and a synthetic one whose figures follow a known cost model the fit must recover); the datasheet for what a report lacks.
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

# 2. a report in gpu-check's own format: tests/data/gpu-check-sim.txt came from
#    OUT=... GPU_CHECK_BACKEND=sim GPU_CHECK_8B="--type bf16 --dim 256 --layers 4 --heads 8 --kv-heads 2
#    --ff 512 --vocab 1024 --ctx 8192" GPU_CHECK_8B_POOL_MIB=256 GPU_CHECK_8B_SERVE_POOL_MIB=1024
#    bash tests/tools/gpu-check.sh (CPU figures of the sim backend, not a GPU's)
out=$("$SIM" --costs tests/data/gpu-check-sim.txt --print-costs 2> "$tmp/err") || { echo "FAIL sim report: exit $?"; exit 1; }
check "sim report" "$out" h2d_gbs 2.84 0.001  # the ttft8b stage's page-in, not paging's 1.19
has "sim report" "$tmp/err" "4 of 4 figures measured"
has "sim report" "$tmp/err" "NOT A GPU CHECK"
has "sim report" "$tmp/err" "prefill of 512 tokens"

# 3. synthetic figures in the same line formats, made from step = 0.2 ms + bytes / 4000 GB/s +
#    0.01 ms x batch and prefill at 600 TFLOP/s (not measured: the fit must recover them)
cat > "$tmp/synthetic.txt" <<'EOF'
gpuswapd gpu-check, started 2026-12-03T00:00:00Z, BUILD=build-gpu
verdict: PASS (all 7 stages), 300 s elapsed

== env (box 10 s, limit 10 s)
gpu: Synthetic H200, driver 999.0, memory 143771 MiB, max memory clock 3201 MHz

== paging (box 45 s, limit 45 s)
page-in wall (map + copy overlapped): 48.0 GB/s = 0.9x a raw copy into the VMM-mapped range (53.0 GB/s), 0.9x a raw copy into a cudaMalloc buffer (53.0 GB/s)

== ttft8b (box 135 s, limit 135 s)
8B BF16, 16060000000 bytes: time to first token (8-token prompt) resident 20.0 ms, swapped out 330.0 ms
page-in 51.5 GB/s (raw copy 53.0 GB/s mapped, 53.1 GB/s plain), map 200.0 GB/s

== decode8b (box 30 s, limit 30 s)
decode, batch 1, context 128: 236.1 tok/s, 16100000000 bytes read per token = 3801.7 GB/s

== serve8b (box 40 s, limit 40 s)
decode, batch 8, context 4096: 1490.1 tok/s, 2544370912 bytes read per token = 3791.4 GB/s
decode, batch 32, context 4096: 3624.0 tok/s, 1038745912 bytes read per token = 3764.4 GB/s
prefill of 512 tokens: 20000.0 tok/s
prefill of 2048 tokens: 34686.5 tok/s
EOF
out=$("$SIM" --costs "$tmp/synthetic.txt" --print-costs 2> "$tmp/err") || { echo "FAIL synthetic: exit $?"; exit 1; }
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

# 4. a report cut short after the paging stage: page-in measured, the rest from the datasheet
sed '/^== ttft8b/,$d' "$tmp/synthetic.txt" > "$tmp/short.txt"
out=$("$SIM" --costs "$tmp/short.txt" --print-costs 2> "$tmp/err") || { echo "FAIL short: exit $?"; exit 1; }
check short "$out" h2d_gbs 48 0.001
check short "$out" hbm_gbs 4800 0
check short "$out" tflops 989 0
has short "$tmp/err" "1 of 4 figures measured"
has short "$tmp/err" "HBM 4800 GB/s: datasheet"

# 5. a missing report is an error
if "$SIM" --costs "$tmp/none.txt" --print-costs 2> "$tmp/err"; then
    echo "FAIL missing report: exit 0"; fails=$((fails + 1))
else has "missing report" "$tmp/err" "none.txt"; fi
[ "$fails" = 0 ]
