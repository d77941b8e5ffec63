#!/usr/bin/env bash
# run_sim.sh BUILD_DIR OUT_DIR: the trace simulator's default workload, a load sweep, a bursty and an Azure-format run, fleets of 4, 32 and 256 hosts, conversations with and without the prefix cache and its host tier; CSV, summary, PNG plot.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
SIM=$BUILD/tracesim
mkdir -p "$OUT"
[ -x "$SIM" ] || { echo "run_sim.sh: $SIM not built (make $SIM)" >&2; exit 1; }

# The default workload: 12 models (8.6 GB, Llama-3-8B-shaped, Q8_0), a pool
# holding 3 of them plus 4 GiB for KV caches, Zipf 1.0 popularity, Poisson
# arrivals for 300 s at 0.6 of the ideal capacity (every model resident, full
# batches), prompts ~256 and outputs ~96 tokens (lognormal).
DEFAULT_LOAD=${SIM_LOAD:-0.6}
SWEEP=${SIM_SWEEP:-0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.8}
t0=$(date +%s)

echo "== simulator: default workload (load $DEFAULT_LOAD)"
"$SIM" --load "$DEFAULT_LOAD" --label default --csv "$OUT/sim_default.csv"

echo
echo "== simulator: load sweep ($SWEEP)"
"$SIM" --sweep "$SWEEP" --label sweep --csv "$OUT/sim_sweep.csv"

echo
echo "== simulator: bursty arrivals (Gamma, CV 3), load $DEFAULT_LOAD"
"$SIM" --load "$DEFAULT_LOAD" --arrival gamma --cv 3 --label bursty --csv "$OUT/sim_bursty.csv"

echo
echo "== simulator: Azure Functions 2019 format (synthetic sample: 24 functions, 10 minutes, time x4)"
"$SIM" --write-azure-sample "$OUT/azure_sample.csv"
"$SIM" --trace "$OUT/azure_sample.csv" --trace-minutes 10 --trace-scale 4 --label azure-sample \
    --csv "$OUT/sim_azure.csv"

# Fleets (issue 19, point 5): H hosts, each a pool as above (3 models + 4 GiB
# of KV), 10 H models, Zipf 1.0 and uniform popularity, Poisson arrivals at
# 0.5 of the fleet's ideal capacity, every host on the default policy; the
# routers side by side: affinity (gpuswap fleet's placement, HAProxy's
# bounded-load hash over the replicas), round-robin and least-loaded over
# hosts that serve every model. Arrivals for FLEET_DURATION s (SIM_FLEET_LONG
# for 4 and 32 hosts, SIM_FLEET_SHORT for 256, to stay within a minute or two
# on 2 cores); every run drains what it admitted. The six runs go two at a
# time (longest first; 274 s one after the other on a 2-core EPYC, where
# make bench then took over 10 minutes), each printed whole once all are done.
FLEET_LONG=${SIM_FLEET_LONG:-30}
FLEET_SHORT=${SIM_FLEET_SHORT:-5}
FLEET_JOBS=${SIM_FLEET_JOBS:-2}
fleet_run() { # hosts zipf
    local h=$1 z=$2 d=$FLEET_LONG
    [ "$h" -ge 256 ] && d=$FLEET_SHORT
    {
        echo
        echo "== simulator: fleet of $h hosts, $((10 * h)) models, Zipf $z, ${d} s of arrivals at load 0.5"
        "$SIM" --hosts "$h" --zipf "$z" --duration "$d" --load 0.5 --label "fleet-h$h-zipf$z" \
            --csv "$OUT/sim_fleet_h${h}_zipf$z.csv" 2>&1
        echo "rc $?"
    } >"$OUT/sim_fleet_h${h}_zipf$z.log"
}
for hz in "32 0" "256 0" "256 1.0" "32 1.0" "4 0" "4 1.0"; do
    while [ "$(jobs -rp | wc -l)" -ge "$FLEET_JOBS" ]; do wait -n; done
    fleet_run $hz &
done
wait
for z in 1.0 0; do
    for h in 4 32 256; do
        log=$OUT/sim_fleet_h${h}_zipf$z.log
        sed '$d' "$log"
        [ "$(tail -n 1 "$log")" = "rc 0" ] || { echo "run_sim.sh: the fleet of $h hosts, Zipf $z, failed" >&2; exit 1; }
    done
done
echo
echo "fleet page-ins and p99 TTFT (s): hosts zipf | affinity | round-robin | least-loaded"
for f in "$OUT"/sim_fleet_h*_zipf*.csv; do
    awk -F, 'NR > 1 { pi[$4] = $8; p99[$4] = $16; h = $28; z = $1 }
    END { printf "%-24s %8d %7.1f | %8d %7.1f | %8d %7.1f\n", z, pi["affinity"], p99["affinity"],
          pi["round-robin"], p99["round-robin"], pi["least-loaded"], p99["least-loaded"] }' "$f"
done

# Conversations (issue 39, item 4): H200 settings (--costs h200: 55 GB/s host-to-device,
# 4.8 TB/s HBM, 989 TFLOP/s; a 120 GiB pool), Llama-3-8B-shaped models, sessions of up to 10
# turns (each prompt the whole history plus ~256 new tokens; outputs ~96; think times 20 s mean,
# lognormal; context 8192), uniform popularity at 0.1 turns/s a model. Three configurations side
# by side: no prefix cache, the prefix cache (each session's last turn's KV kept as cached KV, the
# pool's first reclaim), and the prefix cache with a 64 GiB host-RAM tier. The most models whose
# p99 TTFT stays within 2 s (each of CONV_SEEDS seeds, to within one model), then one run at a
# fixed count for the prefill and restore figures. About a minute on 2 cores.
CONV="--costs h200 --pool-gib 120 --conversations --max-context 8192 --prefix-cache off,on,host --kv-host 64G --policies default"
CONV_MPG="--models-per-gpu 0.1 --mpg-step 1 --mpg-seeds ${CONV_SEEDS:-3} --duration ${CONV_DURATION:-300}"
echo
echo "== simulator: conversations, models per GPU within p99 TTFT 2 s (H200 settings; prefix cache off, on, on + 64 GiB host tier)"
"$SIM" $CONV $CONV_MPG --wbytes 2 --mpg-max 60 --label conv-bf16 --quiet --csv "$OUT/sim_conv_mpg_bf16.csv" 2>/dev/null &
"$SIM" $CONV $CONV_MPG --wbytes 0.60625 --mpg-max 120 --label conv-q4km --quiet --csv "$OUT/sim_conv_mpg_q4km.csv" 2>/dev/null &
"$SIM" $CONV --wbytes 2 --models 14 --zipf 0 --rate 1.4 --duration "${CONV_DURATION:-300}" --label conv-bf16-m14 \
    --quiet --csv "$OUT/sim_conv_bf16_m14.csv" 2>/dev/null
"$SIM" $CONV --wbytes 0.60625 --models 45 --zipf 0 --rate 4.5 --duration "${CONV_DURATION:-300}" --label conv-q4km-m45 \
    --quiet --csv "$OUT/sim_conv_q4km_m45.csv" 2>/dev/null
wait
awk -F, 'FNR > 1 { printf "%-22s %3d models (p99 TTFT %.2f s; %d: %.2f s)\n", $1, $3, $4, $5, $6 }' \
    "$OUT/sim_conv_mpg_bf16.csv" "$OUT/sim_conv_mpg_q4km.csv"
echo "fixed counts: config | p99 TTFT s | prompt tokens prefilled | from the device | restored from host (restores) | demoted | lost"
awk -F, 'FNR > 1 { printf "%-22s %6.2f %6.1f%% %6.1f%% %6.1f%% (%d) %5d %5d\n", $1, $16, 100 * $32 / $31, 100 * $33 / $31,
    100 * $38 / $31, $37, $34, $35 }' "$OUT/sim_conv_bf16_m14.csv" "$OUT/sim_conv_q4km_m45.csv"

# Acceptance (issue 6, point 2) on the default workload.
echo
awk -F, 'NR > 1 { pi[$4] = $8; ld[$4] = $9; own[$4] = $11; p99[$4] = $16 }
END {
    d = pi["default"]; if (d == 0) d = 1
    printf "page-ins: fifo/default %.2fx, lru/default %.2fx (want >= 5)\n", pi["fifo"] / d, pi["lru"] / d
    printf "p99 TTFT: default %.2f s, fifo %.2f s, lru %.2f s (want default <= both)\n", p99["default"], p99["fifo"], p99["lru"]
    printf "model loads: default %d, Belady on the arrival order %d (%.2fx), Belady on default'\''s own order %d (%.2fx) (want <= 1.5x)\n",
        ld["default"], ld["belady"], ld["default"] / (ld["belady"] ? ld["belady"] : 1), own["default"],
        ld["default"] / (own["default"] ? own["default"] : 1)
    ok = pi["fifo"] >= 5 * pi["default"] && pi["lru"] >= 5 * pi["default"] &&
         p99["default"] <= p99["fifo"] && p99["default"] <= p99["lru"] &&
         ld["default"] <= 1.5 * ld["belady"]
    print "acceptance on the default workload: " (ok ? "holds" : "does NOT hold")
}' "$OUT/sim_default.csv"

# Plot: p99 TTFT and page-ins against load, one line per policy.
png=$OUT/sim_sweep.png
if command -v gnuplot >/dev/null 2>&1; then
    dat=$(mktemp -d)
    trap 'rm -rf "$dat"' EXIT
    for p in default fifo lru belady; do
        awk -F, -v p=$p 'NR > 1 && $4 == p { print $2, $8, $16 }' "$OUT/sim_sweep.csv" > "$dat/$p"
    done
    gnuplot <<EOF
set terminal pngcairo size 1200,480 noenhanced font ",10"
set output "$png"
set key top left
set grid
set offsets graph 0.02, graph 0.02, 0, 0
set multiplot layout 1,2 title "gpuswapd simulator: 12 models, pool holds 3, Zipf 1.0 (load = offered / ideal capacity)"
set xlabel "load"
set ylabel "p99 time to first token (s)"
set logscale y
plot for [p in "default fifo lru"] "$dat/".p using 1:3 with linespoints title p
set ylabel "segment page-ins"
unset logscale y
plot for [p in "default fifo lru belady"] "$dat/".p using 1:2 with linespoints title p
unset multiplot
EOF
    echo "plot: $png"
else
    echo "run_sim.sh: gnuplot not found (Debian package gnuplot-nox): no plot" >&2
fi
echo "results: $OUT/sim_default.csv $OUT/sim_sweep.csv $OUT/sim_bursty.csv $OUT/sim_azure.csv $OUT/sim_fleet_*.csv $OUT/sim_conv_*.csv ($(( $(date +%s) - t0 )) s)"
