#!/usr/bin/env bash
# The trace-driven simulator's self-test (determinism, Belady bound, no pool over-commit) and a small fleet: 4 hosts, 40 models, affinity vs round-robin vs least-loaded.
set -euo pipefail
SIM="${GPUSWAPD_BUILD:-build}/tracesim"
"$SIM" --self-test

csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
"$SIM" --hosts 4 --models 40 --duration 30 --load 0.5 --quiet --csv "$csv"
awk -F, 'NR > 1 {
    n++
    if ($5 != $6 || $7 != 0) { printf "FAIL %s: %s of %s requests completed, %s failed\n", $4, $6, $5, $7; bad = 1 }
    else printf "ok   fleet %s: every request completes (%s)\n", $4, $6
    if ($24 != 0) { printf "FAIL %s: %s pool violations\n", $4, $24; bad = 1 }
    pi[$4] = $8; p99[$4] = $16
}
END {
    if (n != 3) { print "FAIL fleet: want 3 rows, got " n; exit 1 }
    ok = pi["affinity"] < pi["round-robin"] && pi["affinity"] < pi["least-loaded"]
    printf "%s fleet: affinity %d page-ins < round-robin %d and least-loaded %d (p99 TTFT %.2f / %.2f / %.2f s)\n",
        ok ? "ok  " : "FAIL", pi["affinity"], pi["round-robin"], pi["least-loaded"],
        p99["affinity"], p99["round-robin"], p99["least-loaded"]
    exit (bad || !ok)
}' "$csv"

# Fair baselines (issue 14): lru-batch N for N = 1 .. the models the pool holds (3
# here), and the best of them per metric; the default beside them on a small
# workload (4 models, Zipf 1.0, load 0.2, 60 s of arrivals).
csv2=$(mktemp)
trap 'rm -f "$csv" "$csv2"' EXIT
"$SIM" --zipf 1.0 --models 4 --duration 60 --load 0.2 --policies default,fifo,lru,lru-batch \
    --quiet --csv "$csv2"
awk -F, 'NR > 1 {
    pi[$4] = $8; t99[$4] = $16; e99[$4] = $19; done_[$4] = ($5 == $6 && $7 == 0)
    if ($4 ~ /^lru-batch-[0-9]+$/) { nb++; if (!(1 in mpi) || $8 + 0 < mpi[1]) mpi[1] = $8 + 0
        if (!(2 in mpi) || $16 + 0 < mpi[2]) mpi[2] = $16 + 0; if (!(3 in mpi) || $19 + 0 < mpi[3]) mpi[3] = $19 + 0 }
}
function ok(c, msg) { printf "%s %s\n", c ? "ok  " : "FAIL", msg; if (!c) bad = 1 }
END {
    ok(nb == 3 && ("lru-batch-best" in pi), "lru-batch: N = 1, 2, 3 (the pool holds 3) and a best row (" nb " rows)")
    ok(pi["lru-batch-best"] == mpi[1] && t99["lru-batch-best"] == mpi[2] && e99["lru-batch-best"] == mpi[3],
       sprintf("lru-batch-best takes the best N per metric (page-ins %d, p99 TTFT %.2f s, p99 e2e %.2f s)",
               mpi[1], mpi[2], mpi[3]))
    ok(done_["default"] && done_["lru-batch-1"] && done_["lru-batch-2"] && done_["lru-batch-3"],
       "default and every lru-batch N complete every request")
    ok(pi["default"] < pi["lru-batch-best"] && pi["default"] < pi["lru"],
       sprintf("default pages in less than the best lru-batch N and lru (%d < %d, %d; fifo %d)",
               pi["default"], pi["lru-batch-best"], pi["lru"], pi["fifo"]))
    exit bad
}' "$csv2"

# Models per GPU: the search answers the most models (a multiple of the step) whose
# p99 TTFT is within the target, and the next count over it.
"$SIM" --h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --wbytes 2 --models-per-gpu 0.1 --mpg-step 5 \
    --mpg-max 30 --duration 60 --policies default,lru --quiet --csv "$csv2"
awk -F, 'NR > 1 { n++
    c = ($3 % 5 == 0) && $4 <= 2 && ($6 > 2 || $5 > 30)
    printf "%s models per GPU, %s: %d within p99 TTFT 2 s (%.2f s), %d over it (%.2f s)\n", c ? "ok  " : "FAIL", $2, $3, $4, $5, $6
    if (!c) bad = 1 }
END { if (n != 2) { print "FAIL models per GPU: want 2 rows, got " n; bad = 1 } exit bad }' "$csv2"

# With --mpg-seeds 2 a count passes only within the target with seeds 1 and 2
# both, and its p99 is the worse of the two (each measured on its own here;
# the real hour's token mix, drawn with each seed too).
MPG="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --wbytes 2 --models-per-gpu 0.1 --duration 60
    --tokens-from $(dirname "$0")/../data/traces/AzureLLMInferenceTrace_code.csv --max-context 8192"
"$SIM" $MPG --mpg-step 5 --mpg-max 40 --mpg-seeds 2 --policies default --quiet --no-header > "$csv2"
k=$(cut -d, -f3 "$csv2")
p99s=""
for sd in 1 2; do
    p99s="$p99s $("$SIM" $MPG --mpg-step "$k" --mpg-max "$k" --seed "$sd" --policies default --quiet \
        --no-header | cut -d, -f4)"
done
awk -F, -v s="$p99s" '{ split(s, p, " "); w = p[1] > p[2] ? p[1] : p[2]
    c = $3 > 0 && $4 <= 2 && $4 == w
    printf "%s models per GPU over 2 seeds: %d within p99 TTFT 2 s, the worse seed'"'"'s p99 (%.3f s; seeds 1, 2: %.3f, %.3f s)\n",
        c ? "ok  " : "FAIL", $3, $4, p[1], p[2]
    exit !c }' "$csv2"

# Where the pool cannot hold the running models (uniform, 4 models, load
# 0.95) the default does not thrash: the page-ins of that run were 34,467
# (34,309 preemptions) in 30 s before preemptions were spaced a max_wait apart
# and the drained model kept admitting nothing until idle; 251 (28) after.
"$SIM" --zipf 0 --models 4 --duration 30 --load 0.95 --policies default --quiet --no-header > "$csv2"
awk -F, '{ n++; c = $5 == $6 && $7 == 0 && $8 < 2000
    printf "%s overload: every request completes (%d of %d), no thrashing (%d page-ins, under 2000; preempted %d)\n",
        c ? "ok  " : "FAIL", $6, $5, $8, $26
    exit !c
}' "$csv2"

# Past saturation with a first-token deadline (issue 44, docs/overload.md): 12 Q8_0 8B models, Zipf
# 1.0, 1.5x capacity. Without a deadline the default's goodput (first tokens within 2 s over all
# arrivals) was 0.13 against lru-batch's best 0.23; with --deadline 2 it refuses what it predicts
# will miss: 0.55, against 0.23 for lru-batch and 0.49 for lru-batch with the same refusals, and
# what it admits gets its first token within the deadline. Without --deadline nothing is refused.
"$SIM" --models 12 --zipf 1.0 --load 1.5 --seed 1 --duration 120 --deadline 2 \
    --policies default,lru-batch,lru-batch-drop --quiet --csv "$csv2"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{ slo[$4] = $col["slo_frac"]; ref[$4] = $col["refused"]; adm[$4] = $col["adm_ttft_p99_s"] }
END {
    c = slo["default"] >= 1.1 * slo["lru-batch-best"] && slo["default"] >= slo["lru-batch-drop-best"] &&
        ref["default"] > 0 && ref["lru-batch-best"] == 0 && adm["default"] <= 2.2
    printf "%s deadline 2 s at 1.5x capacity: goodput %.3f (%d refused, admitted p99 TTFT %.2f s) against lru-batch %.3f and lru-batch-drop %.3f\n",
        c ? "ok  " : "FAIL", slo["default"], ref["default"], adm["default"], slo["lru-batch-best"], slo["lru-batch-drop-best"]
    exit !c
}' "$csv2"
"$SIM" --models 12 --zipf 1.0 --load 1.5 --seed 1 --duration 30 --policies default --quiet --csv "$csv2"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{ c = $col["refused"] == 0; printf "%s without --deadline nothing is refused (%d)\n", c ? "ok  " : "FAIL", $col["refused"]; exit !c }' "$csv2"

# Two 70B-shaped models above their 24 GiB quotas in a 40 GiB pool, beside
# 8B and 3B ones (run_sched.sh's mix-q4-70b-quota): one streams at a time, the
# other's page-in waits for its drain, and the small models' requests are not
# held behind their passes. When both streamed at once the default's p99 TTFT
# was 294 s (2.06x lru-batch's best, 142 s) and end-to-end 308 s; 119 s and
# 247 s after, no preemptions.
"$SIM" --h2d-gbs 55 --hbm-gbs 4800 --models 6 --rate 1 --duration 60 --mix 8b-q4,3b-q4,70b-q4 \
    --pool-gib 40 --quota-gib 24 --policies default,lru-batch --quiet --csv "$csv2"
awk -F, 'NR > 1 { done_[$4] = ($5 == $6 && $7 == 0); t99[$4] = $16; e99[$4] = $19; pre[$4] = $26 }
END {
    c = done_["default"] && t99["default"] <= t99["lru-batch-best"] && e99["default"] < 1.1 * e99["lru-batch-best"] && pre["default"] == 0
    printf "%s quota: one 70B streams at a time (p99 TTFT %.1f s, lru-batch best %.1f s; end-to-end %.1f s, best %.1f s; %d preemptions)\n",
        c ? "ok  " : "FAIL", t99["default"], t99["lru-batch-best"], e99["default"], e99["lru-batch-best"], pre["default"]
    exit !c
}' "$csv2"

# Mixture of experts (issue 45): a Qwen3-30B-A3B-shaped model (--mix 30b-a3b-q4: 30.5B
# parameters, 3.3B active) pages in whole, all 18.6 GB, but a one-token step reads only what its
# token's experts need. Against the same shape with every expert active (--experts-used 128):
# the same page-ins and bytes copied, and decode 3.8x faster (e2e p50 0.19 s against 0.71 s).
moe_err=$(mktemp)
trap 'rm -f "$csv" "$csv2" "$moe_err"' EXIT
MOE="--h2d-gbs 55 --hbm-gbs 4800 --models 1 --rate 0.5 --duration 30 --pool-gib 40 --policies default"
"$SIM" $MOE --mix 30b-a3b-q4 --no-header --csv "$csv2" 2> "$moe_err"
"$SIM" $MOE --layers 48 --dim 2048 --ff 0 --heads 32 --kv-heads 4 --head-dim 128 --vocab 151936 \
    --experts 128 --experts-used 128 --expert-ff 768 --wbytes 0.60625 --quiet --no-header >> "$csv2"
line=$(grep '^mixture of experts (model 0)' "$moe_err")
awk -F, -v line="$line" '{ n++; pi[n] = $8; ld[n] = $9; b[n] = $10; e50[n] = $18; ok_[n] = $5 == $6 && $7 == 0 }
END {
    split(line, w, " "); tot = w[6]; act = w[13]
    c = n == 2 && ok_[1] && ok_[2] && tot >= 30.4 && tot <= 30.6 && act >= 3.2 && act <= 3.4 &&
        ld[1] == 1 && pi[1] == 50 && pi[1] == pi[2] && b[1] == b[2] && b[1] > 18.5e9 && b[1] < 18.7e9 &&
        e50[1] * 3 < e50[2]
    printf "%s mixture of experts: %s B parameters, %s B active; pages in %.1f GB in %d page-ins (every expert active: %.1f GB, %d), e2e p50 %.3f s against %.3f s\n",
        c ? "ok  " : "FAIL", tot, act, b[1] / 1e9, pi[1], b[2] / 1e9, pi[2], e50[1], e50[2]
    exit !c
}' "$csv2"

# LoRA adapters (issue 46): an 8B BF16 base on H200 settings, max_batch 64, 20 req/s over 1 and
# over 200 rank-16 adapters (the same arrivals and tokens): both complete; the 200 adapters'
# device copies (27.3 MB each) page in with the base, and a pass reading each distinct adapter
# once costs a few percent (e2e p50 0.674 s against 0.652 s). The same 200 as merged models
# (each a copy of the base) thrash: p99 TTFT 168 s. Then adapters per GPU at 0.1 req/s each (one
# seed, 60 s): the default 350 against 100 for multi-LoRA with 8 device slots and 10 merged
# models under lru (docs/scheduling.md, "LoRA adapters": the measured table).
LORA="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --wbytes 2 --max-batch 64 --models 1 --zipf 0
    --rate 20 --duration 30 --policies default --quiet --no-header"
"$SIM" $LORA --lora-adapters 1 > "$csv2"
"$SIM" $LORA --lora-adapters 200 >> "$csv2"
"$SIM" $LORA --lora-adapters 200 --lora-merged >> "$csv2"
awk -F, '{ n++; ok_[n] = $5 == $6 && $7 == 0 && $24 == 0; b[n] = $10; t99[n] = $16; e50[n] = $18 }
END {
    per = (b[2] - b[1]) / 199
    c = n == 3 && ok_[1] && ok_[2] && per > 27.0e6 && per < 27.6e6 && e50[2] > e50[1] &&
        e50[2] < 1.2 * e50[1] && t99[3] > 10 * t99[2]
    printf "%s LoRA: 200 adapters page in with the base (%.1f MB each), e2e p50 %.3f s against %.3f s for one adapter; merged models p99 TTFT %.1f s against %.2f s\n",
        c ? "ok  " : "FAIL", per / 1e6, e50[2], e50[1], t99[3], t99[2]
    exit !c
}' "$csv2"
LMPG="--h2d-gbs 55 --hbm-gbs 4800 --pool-gib 120 --wbytes 2 --max-batch 64 --models 1 --lora-adapters 1
    --models-per-gpu 0.1 --duration 60 --quiet --no-header"
"$SIM" $LMPG --mpg-step 50 --mpg-max 500 --policies default,lora-slots-8 > "$csv2"
"$SIM" $LMPG --lora-merged --mpg-step 5 --mpg-max 30 --policies lru >> "$csv2"
awk -F, '{ n[$2] = $3 }
END {
    c = n["default"] >= 300 && n["default"] > n["lora-slots-8"] && n["default"] > n["lru"]
    printf "%s LoRA adapters per GPU: default %d, multi-LoRA with 8 slots %d, merged models under lru %d\n",
        c ? "ok  " : "FAIL", n["default"], n["lora-slots-8"], n["lru"]
    exit !c
}' "$csv2"
