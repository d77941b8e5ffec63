#!/usr/bin/env bash
# run_overload.sh BUILD_DIR OUT_DIR: issue 44's overload rows (make bench-overload). H200 settings, Llama-3-8B-shaped
# models BF16- and Q4_K_M-sized, uniform and Zipf 1.0 popularity: N* is the most models the default serves at 0.1
# req/s each within p99 TTFT 2 s with every seed of OVERLOAD_SEEDS; then N* models at 0.08 (below saturation),
# 0.125, 0.15 and 0.2 req/s each with a first-token deadline of 2 s: the default (refusing what it predicts will miss,
# docs/overload.md) beside lru-batch N (every N the pool holds; no refusals) and lru-batch-drop N (the same refusal
# rule). Goodput is tracesim's slo_frac: requests whose first token came within 2 s over all arrivals; refused
# requests count as misses. CSVs in OUT_DIR/overload_*.csv and a summary with the issue's ratios.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
SIM=$BUILD/tracesim
DUR=${OVERLOAD_DURATION:-120}
SEEDS=${OVERLOAD_SEEDS:-1 2 3}
mkdir -p "$OUT"
[ -x "$SIM" ] || { echo "run_overload.sh: $SIM not built (make $SIM)" >&2; exit 1; }
t0=$(date +%s)
H200="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --duration $DUR"

p99_of() { # tracesim options: the default's p99 TTFT (s) on one run
    "$SIM" $H200 --policies default --quiet --csv /dev/stdout "$@" |
        awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "ttft_p99_s") c = i } NR == 2 { print $c }'
}

nstar() { # wbytes zipf from: the most models (counting up from `from`) within 2 s for every seed
    local wbytes=$1 zipf=$2 n=$3 best=0
    while :; do
        local ok=1
        for s in $SEEDS; do
            p=$(p99_of --wbytes "$wbytes" --zipf "$zipf" --models "$n" --seed "$s" \
                --rate "$(awk -v n="$n" 'BEGIN { print 0.1 * n }')")
            awk -v p="$p" 'BEGIN { exit !(p <= 2) }' || { ok=0; break; }
        done
        [ $ok = 1 ] || break
        best=$n
        n=$((n + 1))
    done
    echo "$best"
}

rows() { # label wbytes zipf nstar
    local label=$1 wbytes=$2 zipf=$3 n=$4
    for per in 0.08 0.125 0.15 0.2; do
        for s in $SEEDS; do
            "$SIM" $H200 --wbytes "$wbytes" --zipf "$zipf" --models "$n" --seed "$s" --deadline 2 \
                --rate "$(awk -v n="$n" -v r="$per" 'BEGIN { print r * n }')" \
                --policies default,lru-batch,lru-batch-drop --label "${label}-r${per}-s${s}" --quiet \
                --csv "$OUT/overload_${label}_r${per}_s${s}.csv"
        done
    done
}

rm -f "$OUT"/overload_*.csv "$OUT/overload_nstar.txt.tmp"
# N* searched upward from below the uniform figures of docs/scheduling.md (BF16 16, Q4_K_M-sized 50)
for cfg in "bf16 2" "q4km 0.60625"; do
    set -- $cfg
    for zipf in 0 1; do
        from=$([ "$1" = bf16 ] && echo 10 || echo 35)
        n=$(nstar "$2" "$zipf" "$from")
        echo "N* $1 zipf $zipf: $n models at 0.1 req/s each within p99 TTFT 2 s (seeds $SEEDS, $DUR s)"
        echo "$1 $zipf $n" >> "$OUT/overload_nstar.txt.tmp"
        rows "$1-zipf$zipf" "$2" "$zipf" "$n" &
    done
done
wait
mv "$OUT/overload_nstar.txt.tmp" "$OUT/overload_nstar.txt"
/usr/bin/python3 - "$OUT" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
fail = capped = 0
print("%-22s %6s %7s %7s %8s %8s %8s %7s %7s %9s" % (
    "row", "seed", "default", "refused", "adm p99", "lrub max", "drop max", "x lrub", "x drop", "verdict"))
for path in sorted(glob.glob(os.path.join(out, "overload_*_s*.csv"))):
    rows = list(csv.DictReader(open(path)))
    d = next(r for r in rows if r["policy"] == "default")
    lrub = max(float(r["slo_frac"]) for r in rows if r["policy"].startswith("lru-batch-")
               and not r["policy"].startswith("lru-batch-drop") and r["policy"] != "lru-batch-best")
    drop = max(float(r["slo_frac"]) for r in rows if r["policy"].startswith("lru-batch-drop-")
               and r["policy"] != "lru-batch-drop-best")
    g, adm, refused = float(d["slo_frac"]), float(d["adm_ttft_p99_s"]), int(d["refused"])
    name = os.path.basename(path)[9:-4]
    label, seed = name.rsplit("_s", 1)
    if "_r0.08" in name:
        ok = refused == 0
        verdict = "ok" if ok else "REFUSED"
    else:
        ok = g >= 1.1 * lrub and g >= drop and adm <= 2.2
        verdict = "ok" if ok else "MISS"
        # 1.1x a baseline that serves over 1/1.1 of the arrivals is above 1: unattainable; the
        # default then has to serve at least as many as it
        if not ok and 1.1 * lrub > 1 and g >= lrub and g >= drop and adm <= 2.2:
            ok, verdict = True, "ok (cap)"
            capped += 1
    fail += not ok
    print("%-22s %6s %7.3f %7d %8.3f %8.3f %8.3f %7.2f %7.2f %9s" % (
        label, seed, g, refused, adm, lrub, drop, g / lrub if lrub else float("inf"),
        g / drop if drop else float("inf"), verdict))
print("%d rows miss the acceptance (0.08: nothing refused; above: goodput >= 1.1x every lru-batch N, "
      ">= 1.0x every lru-batch-drop N, admitted p99 <= 2.2 s); %d where 1.1x the best lru-batch N is "
      "above 1 (ok (cap): at least as much as it)" % (fail, capped))
EOF
echo "results: $OUT/overload_*.csv ($(($(date +%s) - t0)) s)"
