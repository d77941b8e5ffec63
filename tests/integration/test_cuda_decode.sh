#!/usr/bin/env bash
# The CUDA block-type decoders (daemon/backend/cuda/cuda_quant.cuh) compiled on the host by
# tests/tools/cuda_decode_check.cpp with quant (daemon/kernels/quant*.c) and wtype.c: every decoder equals quant_row_to_f32
# bit for bit (the GPU kernels' index math checked where no GPU is); and a planted wrong shift in a
# copy of the header is caught, so the check can fail.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gsd-cudadec.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
CXX=${CXX:-c++}
command -v "$CXX" >/dev/null || { echo "skip: $CXX not installed (a C++ compiler builds the check)"; exit 0; }
CC=${CC:-cc}
fail=0

# build ROOT OUT: the check against the daemon sources under ROOT
build() {
    local root=$1 out=$2 objs=() f o
    for f in "$root"/daemon/kernels/quant*.c "$root/daemon/kernels/wtype.c"; do
        o=$out-$(basename "$f" .c).o
        $CC -std=c11 -D_GNU_SOURCE -O2 -iquote "$root/daemon" -c "$f" -o "$o" || return 1
        objs+=("$o")
    done
    $CXX -std=c++17 -O2 -Wall -Wextra -Wno-unknown-pragmas -Werror -I "$root/daemon" \
        tests/tools/cuda_decode_check.cpp "${objs[@]}" -lm -o "$out"
}

if ! build "$PWD" "$tmp/check" >"$tmp/build.log" 2>&1; then
    echo "FAIL the check does not build:"; cat "$tmp/build.log"; exit 1
fi
if "$tmp/check" >"$tmp/out" 2>&1; then
    echo "ok   every CUDA decoder equals quant_row_to_f32 bit for bit:"
    sed 's/^/     /' "$tmp/out"
else
    echo "FAIL the CUDA decoders differ from quant_row_to_f32:"; cat "$tmp/out"; fail=1
fi

# a planted mistake (Q6_K's high bits from the wrong pair) must fail it
mkdir -p "$tmp/src"
cp -r daemon "$tmp/src/"
sed -i 's/hi = (qh\[k\] >> 2 \* g) & 3/hi = (qh[k] >> 2 * (g ^ 1)) \& 3/' "$tmp/src/daemon/backend/cuda/cuda_quant.cuh"
if cmp -s daemon/backend/cuda/cuda_quant.cuh "$tmp/src/daemon/backend/cuda/cuda_quant.cuh"; then
    echo "FAIL the planted mistake found nothing to change (the Q6_K decoder's text moved?)"; fail=1
elif ! build "$tmp/src" "$tmp/planted" >"$tmp/build2.log" 2>&1; then
    echo "FAIL the planted copy does not build:"; cat "$tmp/build2.log"; fail=1
elif "$tmp/planted" >"$tmp/out2" 2>&1; then
    echo "FAIL a wrong Q6_K decoder passed the check"; fail=1
elif grep -q "^Q6_K .* 0 differ" "$tmp/out2" || ! grep -q "^Q4_K .* 0 differ" "$tmp/out2"; then
    echo "FAIL the planted mistake was not pinned on Q6_K alone:"; cat "$tmp/out2"; fail=1
else
    echo "ok   a planted wrong shift in the Q6_K decoder fails the check: $(grep -E '^Q6_K +[0-9]+ values' "$tmp/out2")"
fi
exit $fail
