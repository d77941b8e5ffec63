#!/usr/bin/env bash
# `make check` (tests/tools/check.sh) passes on a formatted copy of the sources and fails, naming the
# file, on one planted violation of each rule: an include against the layer order, a layered header
# without its layer's path, a CUDA header outside daemon/backend/cuda/, a clang-format difference,
# a function nothing calls and Markdown table rows without a header.
set -u
cd "$(dirname "$0")/../.."
root=$PWD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gsd-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
for c in clang-format cppcheck; do
    command -v $c >/dev/null || { echo "skip: $c not installed (make deps)"; exit 0; }
done

fresh() { # a copy of the sources in the house style
    rm -rf "$tmp/src" && mkdir -p "$tmp/src/tests/tools"
    cp -r daemon proto config clients .clang-format "$tmp/src/"
    cp tests/tools/check.sh tests/tools/check-unused.txt "$tmp/src/tests/tools/"
    (cd "$tmp/src" && find daemon proto config clients -name '*.[ch]' -o -name '*.cu' | xargs clang-format -i)
}

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
printf '#include "quant.h"\n' >> "$tmp/src/daemon/store.c"
expect layers '"quant.h" must be written with its layer'
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
# table rows after a paragraph, without a header (docs/ARCHITECTURE.md had them)
printf '\nA paragraph.\n| `proto/` | the codec |\n| `config/` | the loader |\n' >> "$tmp/src/proto/PROTOCOL.md"
expect tables 'proto/PROTOCOL.md:'
fresh
printf '\n| a | b |\n| --- |\n| 1 | 2 |\n' >> "$tmp/src/proto/PROTOCOL.md"
expect tables 'the header has 2 cells, its delimiter row 1'

exit $fail
