#!/usr/bin/env bash
# The engine benchmark: prefill and decode tok/s of the 134M Llama shape per weight type and thread
# count, and, with LLAMA_CPP=DIR (a llama.cpp build: DIR/bin/llama-bench or DIR/build/bin/llama-bench),
# llama.cpp's llama-bench on the same files, alternated with ours in the same run, with the ratios.
#
# usage: run_engine.sh BUILD [TYPES...]   (env: BENCH_REPS repetitions per run, best taken, default 2;
#        BENCH_ROUNDS alternating rounds, medians reported, default 3 with LLAMA_CPP, else 1;
#        BENCH_THREADS, default "1 2"; BENCH_DECODE decode tokens, default 32)
set -euo pipefail
BUILD=${1:-build}
shift || true
TYPES=${*:-f32 f16 q8_0 q4_k_m q6_k}
OUT=$BUILD/bench
mkdir -p "$OUT"
REPS=${BENCH_REPS:-2}
THREADS=${BENCH_THREADS:-1 2}
ND=${BENCH_DECODE:-32}
NP=128

LB=
if [ -n "${LLAMA_CPP:-}" ]; then
    for c in "$LLAMA_CPP/bin/llama-bench" "$LLAMA_CPP/build/bin/llama-bench" "$LLAMA_CPP"; do
        if [ -x "$c" ] && [ -f "$c" ]; then LB=$c; break; fi
    done
    if [ -z "$LB" ]; then
        echo "LLAMA_CPP=$LLAMA_CPP: no llama-bench there (cmake --build BUILD --target llama-bench)" >&2
        exit 2
    fi
fi
ROUNDS=${BENCH_ROUNDS:-$([ -n "$LB" ] && echo 3 || echo 1)}

echo "== engine: 134M-parameter Llama (dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000)," \
     "prefill $NP tokens, decode $ND"
echo "   CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores;" \
     "isa flags: $(grep -m1 -o -w -E 'avx512_vnni|avx512bw|avx_vnni|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
[ -n "$LB" ] && echo "   llama.cpp: $LB ($(cd "$(dirname "$LB")" && git describe --always 2>/dev/null || echo '?'))"

# raw.csv: who,type,threads,round,prefill_tok_s,decode_tok_s
raw=$OUT/engine_raw.csv
echo "who,type,threads,round,prefill_tok_s,decode_tok_s" > "$raw"
tcomma=$(echo $THREADS | tr ' ' ',')
for t in $TYPES; do
    m=$OUT/llama134m-$t.gguf
    [ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type "$t" --dim 768 --layers 12 --heads 12 \
        --kv-heads 12 --ff 2048 --vocab 32000 --ctx 2048 --seed 7 >/dev/null
done
for r in $(seq "$ROUNDS"); do
    for t in $TYPES; do
        m=$OUT/llama134m-$t.gguf
        # ours, then llama.cpp, on the same file, one after the other
        "$BUILD/bench_engine" "$m" $NP "$ND" "$REPS" $THREADS |
            awk -F, -v t="$t" -v r="$r" '{print "gpuswapd," t "," $3 "," r "," $5 "," $6}' >> "$raw"
        if [ -n "$LB" ]; then
            # llama-bench: pp (n_gen 0) and tg (n_prompt 0) rows, avg_ts by header name
            "$LB" -m "$m" -p $NP -n "$ND" -t "$tcomma" -r "$REPS" -o csv 2>/dev/null |
                awk -F, -v t="$t" -v r="$r" '
                    NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
                    { for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
                      th = $col["n_threads"]
                      if ($col["n_gen"] == 0) pp[th] = $col["avg_ts"]; else tg[th] = $col["avg_ts"]
                      seen[th] = 1 }
                    END { for (th in seen) printf "llama.cpp,%s,%s,%s,%.1f,%.1f\n", t, th, r, pp[th], tg[th] }' >> "$raw"
        fi
    done
done

# medians per (who, type, threads), then one line per (type, threads)
csv=$OUT/engine.csv
echo "type,threads,prefill_tok_s,decode_tok_s,llama_prefill_tok_s,llama_decode_tok_s,prefill_ratio,decode_ratio" > "$csv"
tail -n +2 "$raw" | sort -t, -k1,1 -k2,2 -k3,3n -k5,5g | awk -F, '
    function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    { k = $1 "," $2 "," $3; n[k]++; p[k, n[k]] = $5; d[k, n[k]] = $6; keys[k] = 1 }
    END {
        for (k in keys) {
            m = n[k]
            for (i = 1; i <= m; i++) { pa[i] = p[k, i]; da[i] = d[k, i] }
            # p[] came sorted by prefill; sort the decode figures too
            for (i = 2; i <= m; i++) { v = da[i]; j = i - 1
                while (j >= 1 && da[j] > v) { da[j + 1] = da[j]; j-- } da[j + 1] = v }
            print k "," med(pa, m) "," med(da, m)
        }
    }' | sort > "$OUT/engine_med.csv"
awk -F, '
    $1 == "gpuswapd" { o[$2 "," $3] = $4 "," $5; order[++no] = $2 "," $3 }
    $1 == "llama.cpp" { l[$2 "," $3] = $4 "," $5 }
    END {
        for (i = 1; i <= no; i++) {
            k = order[i]; split(o[k], a, ",")
            if (k in l) { split(l[k], b, ",")
                printf "%s,%s,%s,%s,%s,%.2f,%.2f\n", k, a[1], a[2], b[1], b[2], a[1] / b[1], a[2] / b[2] }
            else printf "%s,%s,%s,,,,\n", k, a[1], a[2]
        }
    }' "$OUT/engine_med.csv" >> "$csv"

if [ -n "$LB" ]; then
    printf "%-7s %-7s %-20s %-20s %-8s %-8s\n" type threads "prefill ours/llama" "decode ours/llama" "prefill" "decode"
else
    printf "%-7s %-7s %-14s %-14s\n" type threads "prefill tok/s" "decode tok/s"
fi
tail -n +2 "$csv" | while IFS=, read -r ty th pf dc lpf ldc rp rd; do
    if [ -n "$LB" ]; then
        printf "%-7s %-7s %-20s %-20s %-8s %-8s\n" "$ty" "$th" "$pf / $lpf" "$dc / $ldc" "${rp}x" "${rd}x"
    else
        printf "%-7s %-7s %-14s %-14s\n" "$ty" "$th" "$pf" "$dc"
    fi
done
echo "results: $csv (medians of $ROUNDS round(s), each the best of $REPS), every run in $raw"
