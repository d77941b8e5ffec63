#!/usr/bin/env bash
# `make check` (tests/tools/check.sh) passes on a formatted copy of the sources and fails, naming the
# file, on one planted violation of each rule: an include against the layer order, a layered header
# without its layer's path, a CUDA header outside daemon/backend/cuda/, a clang-format difference,
# a function nothing calls, a file over 1,200 lines and a function over 120, README's option table
# edited by hand, Markdown table rows without a header, a folder cycle by includes (in a
# new folder, and between layers), a file cycle by the symbols of two planted objects (and no cycle
# through a function pointer), a stale line in tests/tools/check-cycles.txt and missing objects.
# The file rule reads the production objects of the build (GPUSWAPD_BUILD, make all), copied.
set -u
cd "$(dirname "$0")/../.."
root=$PWD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gsd-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
for c in clang-format cppcheck; do
    command -v $c >/dev/null || { echo "skip: $c not installed (make deps)"; exit 0; }
done
build=${GPUSWAPD_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
# the objects of the production sources, for the file rule: BUILD of every check.sh run below
mkdir -p "$tmp/build/obj"
for d in daemon proto config clients; do
    [ -d "$build/obj/$d" ] || { echo "FAIL no objects in $build/obj/$d (make all builds them)"; exit 1; }
    cp -r "$build/obj/$d" "$tmp/build/obj/"
done
cp "$build/gpuswapd" "$tmp/build/" || { echo "FAIL no $build/gpuswapd (make all builds it)"; exit 1; }
export BUILD=$tmp/build

# a copy of the sources in the house style, made once; fresh() puts it back in $tmp/src
mkdir -p "$tmp/clean/tests/tools"
cp -r daemon proto config clients .clang-format Makefile README.md "$tmp/clean/"
cp tests/tools/check.sh tests/tools/check-unused.txt tests/tools/cycles.py tests/tools/check-cycles.txt \
    tests/tools/sizes.py tests/tools/options-table.py "$tmp/clean/tests/tools/"
(cd "$tmp/clean" && find daemon proto config clients -name '*.[ch]' -o -name '*.cu' | xargs clang-format -i)
fresh() {
    rm -rf "$tmp/src" && cp -r "$tmp/clean" "$tmp/src"
    rm -f "$tmp/build/obj/daemon/worker/planted_"*
}

# cc FILE.c: its object where the file rule looks for it
cc_planted() { ${CC:-cc} -std=c11 -Wall -Werror -c "$tmp/src/$1" -o "$BUILD/obj/${1%.c}.o"; }

# expect RULE WANT: check.sh with CHECK_ONLY=RULE fails and says WANT
expect() {
    local rule=$1 want=$2 out rc
    out=$(CHECK_ONLY=$rule bash "$tmp/src/tests/tools/check.sh" "$tmp/src" 2>&1); rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" <<<"$out"; then
        echo "FAIL $rule: rc $rc, wanted '$want' in:"; echo "$out" | head -5; fail=1
    else
        echo "ok   $rule fails on the planted violation: $(grep -F -- "$want" <<<"$out" | head -1)"
    fi
}

fresh
out=$(bash "$tmp/src/tests/tools/check.sh" "$tmp/src" 2>&1) || { echo "FAIL the clean copy: $out"; exit 1; }
echo "ok   the formatted copy passes: $out"

# a kernel that includes engine code (a layer above it)
printf '#include "engine/model.h"\n' >> "$tmp/src/daemon/kernels/pool.c"
expect layers 'daemon/kernels/pool.c:'
fresh
# the backend interface including model code again
sed -i 's|#include "kernels/tensor.h"|#include "kernels/tensor.h"\n#include "engine/model.h"|' "$tmp/src/daemon/backend/backend.h"
expect layers 'daemon/backend/backend.h:'
fresh
# a layered header by its bare name, from another folder
printf '#include "quant.h"\n' >> "$tmp/src/daemon/worker/store.c"
expect layers '"quant.h" must be written with its layer'
fresh
# the worker including the front end (a layer above it); a source file straight in daemon/
printf '#include "front/server.h"\n' >> "$tmp/src/daemon/worker/scheduler.c"
expect layers 'daemon/worker/scheduler.c:'
fresh
printf 'int planted_loose;\n' > "$tmp/src/daemon/loose.c"
expect layers 'daemon/loose.c: not in a layer folder'
fresh
# CUDA outside daemon/backend/cuda/
sed -i '0,/#include <math.h>/s||#include <math.h>\n#include <cuda_runtime.h>|' "$tmp/src/daemon/engine/forward.c"
grep -q cuda_runtime "$tmp/src/daemon/engine/forward.c" || printf '#include <cuda_runtime.h>\n' >> "$tmp/src/daemon/engine/forward.c"
expect cuda 'daemon/engine/forward.c'
fresh
cp "$tmp/src/daemon/backend/cuda/cuda.cu" "$tmp/src/daemon/engine/extra.cu"
expect cuda 'daemon/engine/extra.cu: CUDA source outside'
fresh
# a clang-format difference
printf 'static int  planted_format (void){ return 0 ; }\n' >> "$tmp/src/daemon/base/log.c"
expect format 'daemon/base/log.c:'
fresh
# a function nothing calls
printf '\nint log_planted_unused(void)\n{\n    return 1;\n}\n' >> "$tmp/src/daemon/base/log.c"
expect unused 'log_planted_unused'
fresh
# a production file over 1,200 lines, a function over 120
for i in $(seq 1300); do echo "/* line $i */"; done >> "$tmp/src/daemon/base/log.c"
expect size 'daemon/base/log.c: 1'
fresh
{ printf '\nint log_planted_long(int x)\n{\n'; for i in $(seq 125); do echo "    x += $i;"; done
  printf '    return x;\n}\n'; } >> "$tmp/src/daemon/base/log.c"
expect size 'log_planted_long is 129 lines, more than 120'
fresh
# README's option table edited by hand: it differs from the schema
sed -i 's/^| `scheduler.max_wait` | duration | `2s` |/| `scheduler.max_wait` | duration | `3s` |/' "$tmp/src/README.md"
expect options 'the option table differs from the schema'
fresh
# table rows after a paragraph, without a header (docs/ARCHITECTURE.md had them)
printf '\nA paragraph.\n| `proto/` | the codec |\n| `config/` | the loader |\n' >> "$tmp/src/proto/PROTOCOL.md"
expect tables 'proto/PROTOCOL.md:'
fresh
printf '\n| a | b |\n| --- |\n| 1 | 2 |\n' >> "$tmp/src/proto/PROTOCOL.md"
expect tables 'the header has 2 cells, its delimiter row 1'
fresh
# folder cycles: a new folder daemon/extra/ and daemon/worker/ including each other; the worker
# including the front end; a kernel including engine
mkdir "$tmp/src/daemon/extra"
printf '#pragma once\n#include "worker/worker.h"\n' > "$tmp/src/daemon/extra/extra.h"
printf '#include "extra/extra.h"\n' >> "$tmp/src/daemon/worker/stats.h"
expect folder-cycles 'daemon/extra/extra.h:2 includes "worker/worker.h" = daemon/worker/worker.h'
fresh
printf '#include "front/auth.h"\n' >> "$tmp/src/daemon/worker/stats.h"
expect folder-cycles 'includes "front/auth.h" = daemon/front/auth.h'
fresh
printf '#include "engine/model.h"\n' >> "$tmp/src/daemon/kernels/pool.c"
expect folder-cycles 'includes "engine/model.h" = daemon/engine/model.h'
fresh
# a file cycle: two objects that call each other
printf 'int planted_b(void);\nint planted_a(void) { return planted_b() + 1; }\n' > "$tmp/src/daemon/worker/planted_a.c"
printf 'int planted_a(void);\nint planted_b(void) { return 0; }\nint planted_c(void) { return planted_a(); }\n' \
    > "$tmp/src/daemon/worker/planted_b.c"
cc_planted daemon/worker/planted_a.c && cc_planted daemon/worker/planted_b.c
expect file-cycles 'file cycle: daemon/worker/planted_a.c -> daemon/worker/planted_b.c -> daemon/worker/planted_a.c (daemon/worker/planted_a.c uses planted_b from daemon/worker/planted_b.c; daemon/worker/planted_b.c uses planted_a from daemon/worker/planted_a.c)'
fresh
# ... but a call back through a function pointer (a sink, a vtable) is no edge: no cycle
printf 'int (*planted_hook)(void);\nint planted_b(void) { return planted_hook ? planted_hook() : 0; }\n' \
    > "$tmp/src/daemon/worker/planted_b.c"
printf 'extern int (*planted_hook)(void);\nint planted_b(void);\nstatic int up(void) { return 1; }\n%s\n' \
    'int planted_a(void) { planted_hook = up; return planted_b(); }' > "$tmp/src/daemon/worker/planted_a.c"
cc_planted daemon/worker/planted_a.c && cc_planted daemon/worker/planted_b.c
if out=$(CHECK_ONLY=file-cycles bash "$tmp/src/tests/tools/check.sh" "$tmp/src" 2>&1); then
    echo "ok   file-cycles passes on a call back through a function pointer"
else
    echo "FAIL file-cycles on a call back through a function pointer:"; echo "$out" | head -5; fail=1
fi
fresh
# a listed cycle that no longer exists, of each kind
echo 'files daemon/worker/gone_b.c daemon/worker/gone_a.c' >> "$tmp/src/tests/tools/check-cycles.txt"
expect file-cycles "'files daemon/worker/gone_a.c daemon/worker/gone_b.c' is no longer a cycle: delete the line"
fresh
echo 'folders daemon/base daemon/engine' >> "$tmp/src/tests/tools/check-cycles.txt"
expect folder-cycles "'folders daemon/base daemon/engine' is no longer a cycle: delete the line"
fresh
# objects not built: the rule names the target that builds them, and builds nothing
BUILD=$tmp/nobuild expect file-cycles 'objects missing (make all builds them'
[ -e "$tmp/nobuild" ] && { echo "FAIL check.sh made $tmp/nobuild"; fail=1; }

exit $fail
