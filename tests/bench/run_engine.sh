#!/usr/bin/env bash
# The engine benchmark: prefill and decode tok/s of the 134M Llama shape per weight type and thread
# count, and llama.cpp's llama-bench on the same files, alternated with ours round by round, with
# medians and ratios: LLAMA_CPP (current llama.cpp) and LLAMA_CPP_OLD (c392e50), each a llama.cpp
# build directory (DIR/bin/llama-bench or DIR/build/bin/llama-bench) or a llama-bench executable
# (a wrapper script is fine). With BENCH_DEPTH=D both first fill D positions of the cache and then
# prefill and decode from there (llama-bench -d; LLAMA_SERVER_OLD, c392e50's llama-server, for the
# old llama-bench without -d), on files whose context holds it (make bench-long).
#
# usage: run_engine.sh BUILD [TYPES...]   (env: BENCH_REPS repetitions per run, best taken, default 2;
#        BENCH_ROUNDS alternating rounds, medians reported, default 5 with a peer, else 1;
#        BENCH_THREADS, default "1 2"; BENCH_PREFILL prompt tokens, default 128; BENCH_DECODE decode
#        tokens, default 32; BENCH_DEPTH, default 0; BENCH_LOAD_MAX: a round that starts or ends with
#        the 1-minute load average above it (default: the core count / 4 + the bench's own threads)
#        is run again, up to 3 times, and the load is recorded per round)
set -euo pipefail
BUILD=${1:-build}
shift || true
TYPES=${*:-f32 f16 q8_0 q4_k_m q6_k}
OUT=$BUILD/bench
mkdir -p "$OUT"
REPS=${BENCH_REPS:-2}
THREADS=${BENCH_THREADS:-1 2}
ND=${BENCH_DECODE:-32}
NP=${BENCH_PREFILL:-128}
DEPTH=${BENCH_DEPTH:-0}
CTX=$(( DEPTH + NP + ND > 2048 ? (DEPTH + NP + ND + 1023) / 1024 * 1024 : 2048 ))
SUFFIX=$([ "$DEPTH" -gt 0 ] && echo "-d$DEPTH" || true)

peer_bin() { # a llama-bench from a build directory or an executable path
    local p=$1 c
    for c in "$p/bin/llama-bench" "$p/build/bin/llama-bench" "$p"; do
        if [ -x "$c" ] && [ -f "$c" ]; then echo "$c"; return 0; fi
    done
    echo "$p: no llama-bench there (cmake --build BUILD --target llama-bench)" >&2
    return 2
}
LB=; LBO=
[ -n "${LLAMA_CPP:-}" ] && LB=$(peer_bin "$LLAMA_CPP")
[ -n "${LLAMA_CPP_OLD:-}" ] && LBO=$(peer_bin "$LLAMA_CPP_OLD")
# A llama-bench without -d (c392e50) sits out a run with a depth; LLAMA_SERVER_OLD (that llama.cpp's
# llama-server) stands in for it there: depth_server.py reads the server's own timings.
LSO=
for v in LB LBO; do
    if [ -n "${!v}" ] && [ "$DEPTH" -gt 0 ] && [[ "$("${!v}" --help 2>&1 || true)" != *--n-depth* ]]; then
        echo "   ${!v}: no -d/--n-depth, left out at depth $DEPTH" >&2
        printf -v "$v" '%s' ""
    fi
done
if [ "$DEPTH" -gt 0 ] && [ -z "$LBO" ] && [ -n "${LLAMA_SERVER_OLD:-}" ]; then
    LSO=$LLAMA_SERVER_OLD
    echo "   llama.cpp old at depth $DEPTH: $LSO through tests/bench/depth_server.py"
fi
ROUNDS=${BENCH_ROUNDS:-$([ -n "$LB$LBO${LLAMA_SERVER_OLD:-}" ] && echo 5 || echo 1)}
maxth=$(echo $THREADS | tr ' ' '\n' | sort -n | tail -1)
LOAD_MAX=${BENCH_LOAD_MAX:-$(awk -v c="$(nproc)" -v t="$maxth" 'BEGIN { print c / 4 + t }')}

echo "== engine: 134M-parameter Llama (dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000)," \
     "prefill $NP tokens, decode $ND$([ "$DEPTH" -gt 0 ] && echo ", both from position $DEPTH" || true)"
echo "   CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores;" \
     "isa flags: $(grep -m1 -o -w -E 'avx512_vnni|avx512bw|avx_vnni|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for b in "$LB" "$LBO"; do
    [ -n "$b" ] && echo "   llama.cpp: $b ($(cd "$(dirname "$(readlink -f "$b")")" && git describe --always 2>/dev/null || echo '?'))"
done
echo "   $ROUNDS round(s), a round with the load average above $LOAD_MAX run again"

# raw.csv: who,type,threads,round,prefill_tok_s,decode_tok_s,load_start,load_end
raw=$OUT/engine${SUFFIX}_raw.csv
echo "who,type,threads,round,prefill_tok_s,decode_tok_s,load_start,load_end" > "$raw"
tcomma=$(echo $THREADS | tr ' ' ',')
for t in $TYPES; do
    m=$OUT/llama134m-$t$([ "$CTX" -gt 2048 ] && echo "-ctx$CTX" || true).gguf
    [ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type "$t" --dim 768 --layers 12 --heads 12 \
        --kv-heads 12 --ff 2048 --vocab 32000 --ctx "$CTX" --seed 7 >/dev/null
done

load1() { cut -d' ' -f1 /proc/loadavg; }
over() { awk -v a="$1" -v m="$LOAD_MAX" 'BEGIN { exit !(a > m) }'; }

# One peer's rows of a round: llama-bench's pp (n_gen 0) and tg (n_prompt 0) rows by header name.
peer_rows() { # WHO BIN MODEL TYPE ROUND
    local d=()
    [ "$DEPTH" -gt 0 ] && d=(-d "$DEPTH")
    "$2" -m "$3" -p "$NP" -n "$ND" "${d[@]}" -t "$tcomma" -r "$REPS" -o csv 2>/dev/null |
        awk -F, -v who="$1" -v t="$4" -v r="$5" '
            NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
            { for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
              th = $col["n_threads"]
              if ($col["n_gen"] == 0) pp[th] = $col["avg_ts"]; else tg[th] = $col["avg_ts"]
              seen[th] = 1 }
            END { for (th in seen) printf "%s,%s,%s,%s,%.1f,%.1f\n", who, t, th, r, pp[th], tg[th] }'
}

for r in $(seq "$ROUNDS"); do
    for t in $TYPES; do
        m=$OUT/llama134m-$t$([ "$CTX" -gt 2048 ] && echo "-ctx$CTX" || true).gguf
        for try in 1 2 3; do
            l0=$(load1)
            # ours, then each peer, on the same file, one after the other
            rows=$(BENCH_DEPTH=$DEPTH "$BUILD/bench_engine" "$m" "$NP" "$ND" "$REPS" $THREADS |
                awk -F, -v t="$t" -v r="$r" '{print "gpuswapd," t "," $3 "," r "," $5 "," $6}')
            [ -n "$LB" ] && rows+=$'\n'$(peer_rows llama.cpp "$LB" "$m" "$t" "$r")
            [ -n "$LBO" ] && rows+=$'\n'$(peer_rows llama.cpp-old "$LBO" "$m" "$t" "$r")
            [ -n "$LSO" ] && rows+=$'\n'$(/usr/bin/python3 "$(dirname "$0")/depth_server.py" "$LSO" \
                "$m" "$DEPTH" "$NP" "$ND" "$REPS" $THREADS |
                awk -F, -v t="$t" -v r="$r" '{print "llama.cpp-old," t "," $1 "," r "," $2 "," $3}')
            l1=$(load1)
            if { over "$l0" || over "$l1"; } && [ "$try" -lt 3 ]; then
                echo "   round $r $t: load average $l0 -> $l1 above $LOAD_MAX, run again" >&2
                sleep 20
                continue
            fi
            echo "$rows" | grep -v '^$' | sed "s/\$/,$l0,$l1/" >> "$raw"
            break
        done
    done
done

# medians per (who, type, threads), then one line per (type, threads)
csv=$OUT/engine$SUFFIX.csv
echo "type,threads,prefill_tok_s,decode_tok_s,llama_prefill_tok_s,llama_decode_tok_s,prefill_ratio,decode_ratio,old_prefill_tok_s,old_decode_tok_s,old_prefill_ratio,old_decode_ratio" > "$csv"
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
    }' | sort > "$OUT/engine${SUFFIX}_med.csv"
awk -F, '
    $1 == "gpuswapd" { o[$2 "," $3] = $4 "," $5; order[++no] = $2 "," $3 }
    $1 == "llama.cpp" { l[$2 "," $3] = $4 "," $5 }
    $1 == "llama.cpp-old" { q[$2 "," $3] = $4 "," $5 }
    function cols(x, k,   b) {
        if (!(k in x)) return ",,,"
        split(x[k], b, ","); return sprintf("%s,%s,%.2f,%.2f", b[1], b[2], a[1] / b[1], a[2] / b[2])
    }
    END {
        for (i = 1; i <= no; i++) {
            k = order[i]; split(o[k], a, ",")
            printf "%s,%s,%s,%s,%s\n", k, a[1], a[2], cols(l, k), cols(q, k)
        }
    }' "$OUT/engine${SUFFIX}_med.csv" >> "$csv"

if [ -n "$LB$LBO$LSO" ]; then
    printf "%-7s %-7s %-26s %-26s %-14s %-14s\n" type threads "prefill ours/cur/old" \
        "decode ours/cur/old" "prefill x cur,old" "decode x cur,old"
else
    printf "%-7s %-7s %-14s %-14s\n" type threads "prefill tok/s" "decode tok/s"
fi
x() { [ -n "$1" ] && echo "${1}x" || echo "-"; }
tail -n +2 "$csv" | while IFS=, read -r ty th pf dc lpf ldc rp rd opf odc orp ord; do
    if [ -n "$LB$LBO$LSO" ]; then
        printf "%-7s %-7s %-26s %-26s %-14s %-14s\n" "$ty" "$th" "$pf / ${lpf:--} / ${opf:--}" \
            "$dc / ${ldc:--} / ${odc:--}" "$(x "$rp") $(x "$orp")" "$(x "$rd") $(x "$ord")"
    else
        printf "%-7s %-7s %-14s %-14s\n" "$ty" "$th" "$pf" "$dc"
    fi
done
echo "results: $csv (medians of $ROUNDS round(s), each the best of $REPS), every run in $raw"
