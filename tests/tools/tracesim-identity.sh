#!/usr/bin/env bash
# tracesim-identity.sh: are the simulator's results byte-identical to a reference commit's on the
# scenarios of `make bench` (issue 36: "tracesim CSVs byte-identical to 6cd8b23's")? Builds REF's
# tracesim in a temporary git worktree and the working tree's (or --new-ref's), runs
# tests/bench/run_sim.sh and run_sched.sh with each (every tracesim invocation as `make bench` makes
# it; the scripts, the trace in tests/data and the working directory are the new side's for both),
# and compares with cmp every file tracesim wrote (CSVs, the Azure sample) and its console output
# (stdout and stderr of each invocation, the "N s wall" clock masked). One line per file, "same" or
# "DIFFERS" (with its first differing lines), then "N files byte-identical".
#
# usage: tests/tools/tracesim-identity.sh [--new-ref REF2] [--only sim|sched] [--quick] [REF [BUILD_DIR]]
#   REF        the reference (default 6cd8b23)
#   BUILD_DIR  the working tree's build dir (default build, relative to the repository root); its
#              tracesim is brought up to date with `make BUILD_DIR/tracesim` (CUDA as the Makefile
#              detects it: CUDA=0 in the environment builds without nvcc)
#   --new-ref  build REF2 (e.g. HEAD) in a second worktree instead of using the working tree (for a
#              tree mid-edit)
#   --only     run_sim.sh's scenarios or run_sched.sh's only
#   --quick    the same invocations, shorter: fleets 5 s (256 hosts 1 s) of arrivals, one seed,
#              models-per-GPU runs of 60 s with one seed. Not the acceptance check.
#   The scripts' own knobs (SIM_*, SCHED_*, MPG_*) pass through from the environment; unset, the
#   runs are exactly make bench's. KEEP=1 keeps the outputs (the worktrees go in any case).
# Exit: 0 every file identical; 1 a file differs or is missing, or no CSV was written; 2 a usage,
# build or run error.
#
# Time on 2 cores at nice 19 beside a load test (load average 5-6), one side after the other:
# builds 25-30 s each; run_sim.sh 10-13 min a side (fleets of 32 and 256 hosts: 150-410 s each, two
# at a time; the rest under 30 s); run_sched.sh 4-10 min a side (models per GPU, Q4_K_M: 100-180 s
# each, five at a time; the rest 1-25 s each). 30 minutes in all; --quick 7.5.
set -u

ref=6cd8b23
build=build
new_ref=
only=
quick=0
while [ $# -gt 0 ]; do
    case $1 in
    --new-ref) new_ref=${2:?--new-ref needs a ref}; shift 2 ;;
    --only) only=${2:?--only needs sim or sched}; shift 2 ;;
    --quick) quick=1; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "tracesim-identity: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] && ref=$1
[ $# -ge 2 ] && build=$2
case $only in '' | sim | sched) ;; *) echo "tracesim-identity: --only sim or sched" >&2; exit 2 ;; esac

top=$(git rev-parse --show-toplevel) || exit 2
cd "$top" || exit 2
git rev-parse -q --verify "$ref^{commit}" >/dev/null || { echo "tracesim-identity: no commit $ref" >&2; exit 2; }
[ -z "$new_ref" ] || git rev-parse -q --verify "$new_ref^{commit}" >/dev/null ||
    { echo "tracesim-identity: no commit $new_ref" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tracesim-identity.XXXXXX") || exit 2
cleanup() {
    local w
    for w in "$tmp/wt-ref" "$tmp/wt-new"; do
        [ -d "$w" ] && git -C "$top" worktree remove --force "$w" >/dev/null 2>&1
    done
    if [ "${KEEP:-0}" = 1 ]; then echo "outputs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 2' INT TERM HUP

if [ "$quick" = 1 ]; then
    export SIM_FLEET_LONG=${SIM_FLEET_LONG:-5} SIM_FLEET_SHORT=${SIM_FLEET_SHORT:-1}
    export SCHED_SEEDS=${SCHED_SEEDS:-1} MPG_DURATION=${MPG_DURATION:-60} MPG_SEEDS=${MPG_SEEDS:-1}
fi

t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }

# make_tracesim DIR BUILD [make options]: builds BUILD/tracesim from the tree at DIR.
make_tracesim() {
    local dir=$1 b=$2
    shift 2
    if ! make -C "$dir" -s -j2 "$@" BUILD="$b" "$b/tracesim" >"$tmp/make.log" 2>&1; then
        echo "tracesim-identity: building $b/tracesim in $dir failed:" >&2
        tail -n 20 "$tmp/make.log" >&2
        exit 2
    fi
}

# ---------------------------------------------------------------- build
echo "== building $ref's tracesim ($(git rev-parse --short "$ref")) in a worktree"
git worktree add -q --detach "$tmp/wt-ref" "$ref" || exit 2
make_tracesim "$tmp/wt-ref" "$tmp/build-ref" CUDA=0
ref_bin=$tmp/build-ref/tracesim

if [ -n "$new_ref" ]; then
    echo "== building $new_ref's tracesim ($(git rev-parse --short "$new_ref")) in a worktree ($(elapsed))"
    git worktree add -q --detach "$tmp/wt-new" "$new_ref" || exit 2
    make_tracesim "$tmp/wt-new" "$tmp/build-new" CUDA=0
    new_tree=$tmp/wt-new
    new_bin=$tmp/build-new/tracesim
    new_name=$new_ref
else
    dirty=$(git status --porcelain --untracked-files=no | wc -l)
    echo "== building the working tree's tracesim in $build (HEAD $(git rev-parse --short HEAD)," \
        "$dirty files changed) ($(elapsed))"
    make_tracesim "$top" "$build"
    new_tree=$top
    case $build in /*) new_bin=$build/tracesim ;; *) new_bin=$top/$build/tracesim ;; esac
    new_name="the working tree"
fi

# The scenarios are the new side's: note where the reference's own differ.
for f in tests/bench/run_sim.sh tests/bench/run_sched.sh tests/data/traces/AzureLLMInferenceTrace_code.csv; do
    if ! git -C "$tmp/wt-ref" cat-file -e "HEAD:$f" 2>/dev/null; then
        echo "note: $ref has no $f"
    elif ! cmp -s "$tmp/wt-ref/$f" "$new_tree/$f"; then
        echo "note: $f differs at $ref; both sides run $new_name's"
    fi
done

# ---------------------------------------------------------------- run
# side NAME BINARY: runs the scripts with a tracesim that is BINARY behind a wrapper keeping each
# invocation's console output (named after the file it writes) and its time.
side() {
    local name=$1 bin=$2 d=$tmp/$1 s
    mkdir -p "$d/bin" "$d/out" "$d/console"
    cat >"$d/bin/tracesim" <<EOF
#!/usr/bin/env bash
out=run; prev=
for a in "\$@"; do
    case \$prev in --csv | --write-azure-sample) out=\${a#$d/out/}; out=\${out//\//_} ;; esac
    prev=\$a
done
s=\$(date +%s)
"$bin" "\$@" >"$d/console/\$out.stdout" 2>"$d/console/\$out.stderr"
rc=\$?
echo "\$((\$(date +%s) - s)) \$out" >>"$d/times"
cat "$d/console/\$out.stdout"
cat "$d/console/\$out.stderr" >&2
exit \$rc
EOF
    chmod +x "$d/bin/tracesim"
    for s in sim sched; do
        [ -z "$only" ] || [ "$only" = "$s" ] || continue
        echo "== $name: run_$s.sh ($(elapsed))"
        if ! (cd "$new_tree" && bash "tests/bench/run_$s.sh" "$d/bin" "$d/out") >"$d/run_$s.log" 2>&1; then
            echo "tracesim-identity: run_$s.sh with $name's tracesim failed ($d/run_$s.log):" >&2
            tail -n 20 "$d/run_$s.log" >&2
            exit 2
        fi
    done
    # the wall clock is the one thing in the console output that may move
    sed -i -E 's/[0-9]+(\.[0-9]+)? s wall/N s wall/' "$d"/console/*
}
side ref "$ref_bin"
side new "$new_bin"

# ---------------------------------------------------------------- compare
# what tracesim wrote: the scripts' own files (plots, the fleet logs that copy the console) aside
list() { (cd "$1" && find . -type f ! -name '*.png' ! -name '*.log' | sed 's|^\./||'); }
files() {
    { list "$tmp/ref/out" | sed 's|^|out/|'; list "$tmp/new/out" | sed 's|^|out/|'
      list "$tmp/ref/console" | sed 's|^|console/|'; list "$tmp/new/console" | sed 's|^|console/|'; } | sort -u
}
echo "== comparing $ref ($tmp/ref) with $new_name ($tmp/new) ($(elapsed))"
same=0 differ=0 csv=0
while read -r f; do
    case $f in out/*.csv) csv=$((csv + 1)) ;; esac
    a=$tmp/ref/$f b=$tmp/new/$f
    if [ ! -f "$a" ] || [ ! -f "$b" ]; then
        echo "DIFFERS $f (only in $([ -f "$a" ] && echo "$ref" || echo "$new_name"))"
        differ=$((differ + 1))
    elif cmp -s "$a" "$b"; then
        echo "same    $f"
        same=$((same + 1))
    else
        echo "DIFFERS $f: $(cmp "$a" "$b" 2>&1 | sed 's|.*differ: ||')"
        diff "$a" "$b" | head -n 6 | sed 's/^/    /'
        differ=$((differ + 1))
    fi
done < <(files)

echo "slowest invocations (s, $ref / $new_name):"
join -j 2 <(sort -k2 "$tmp/ref/times") <(sort -k2 "$tmp/new/times") | sort -k2 -rn | head -n 6 |
    awk '{ printf "    %5d %5d  %s\n", $2, $3, $1 }'
echo "$same files byte-identical, $differ differ ($csv CSVs; $(elapsed))"
[ "$csv" -gt 0 ] || { echo "tracesim-identity: no CSV written" >&2; exit 1; }
[ "$differ" -eq 0 ] || exit 1
exit 0
