#!/usr/bin/env bash
# gpu-bundle: packs the binaries gpu-check runs, and every shared library they need beyond glibc's,
# into one archive to carry to a GPU machine that has neither the libraries nor a package registry.
#
#   bash tests/tools/gpu-bundle.sh FROM BUNDLE ARCHIVE MAX_MIB BIN...
#
# FROM: the build folder the binaries come from; BUNDLE: the folder the archive unpacks to (relative
# to the repository root, e.g. build-gpu); ARCHIVE: the .tar.xz to write; MAX_MIB: the most that may
# travel (the files `git ls-files -co --exclude-standard` lists, plus the archive).
#
# The binaries get DT_RPATH $ORIGIN/lib (patchelf --force-rpath: DT_RPATH, unlike DT_RUNPATH, is
# searched for the libraries' own dependencies too, so libcriterion finds libgit2 and libffi in
# lib/ as well), each library DT_RPATH $ORIGIN: nothing needs LD_LIBRARY_PATH, and the bundled
# copies come before the system's.
set -euo pipefail
[ $# -ge 5 ] || { echo "usage: $0 FROM BUNDLE ARCHIVE MAX_MIB BIN..." >&2; exit 2; }
from=$1 bundle=$2 archive=$3 max_mib=$4
shift 4
command -v patchelf >/dev/null || { echo "gpu-bundle: patchelf not installed (make deps)" >&2; exit 1; }

# glibc's own libraries: the target machine's are used (its loader must match them)
GLIBC_RX='/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[^/]*)\.so'

rm -rf "$bundle"
mkdir -p "$bundle/lib" "$(dirname "$archive")"
for b in "$@"; do
    cp "$from/$b" "$bundle/" && strip --strip-debug "$bundle/$b"
done
for b in "$@"; do ldd "$from/$b" | awk '/=> \//{print $3}'; done | sort -u | grep -Ev "$GLIBC_RX" |
    xargs -r cp -L -t "$bundle/lib"
for b in "$@"; do patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$bundle/$b"; done
for l in "$bundle"/lib/*; do
    chmod u+w "$l"
    patchelf --force-rpath --set-rpath '$ORIGIN' "$l"
done
{
    echo "gpuswapd gpu bundle"
    echo "built: $(date -u +%FT%TZ) on $(uname -srm), $(ldd --version | head -1)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "nvcc: $("${NVCC:-nvcc}" --version 2>/dev/null | tail -1)"
    echo "binaries: $*"
    echo "libraries: $(cd "$bundle/lib" && echo *)"
} > "$bundle/BUILD-INFO"

# highest GLIBC symbol version anything in the bundle needs (the target's glibc must be as new)
need=$({ for b in "$@"; do objdump -T "$bundle/$b"; done; objdump -T "$bundle"/lib/*; } 2>/dev/null |
    grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true)
echo "needs: ${need:-GLIBC (none versioned)} or newer on the target" >> "$bundle/BUILD-INFO"

tmp=$archive.tmp
XZ_OPT=${XZ_OPT:--6 -T2} tar -cJf "$tmp" "$bundle"
mv -f "$tmp" "$archive"

# what travels: the working tree the device copies (tracked and untracked-not-ignored files) plus
# the archive; the unpacked bundle stays here (ignored)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
arch=$(stat -c %s "$archive")
total=$((tree + arch))
printf 'gpu-bundle: %s (%.1f MiB; %s unpacked, %s); travels with the tree: %.1f + %.1f = %.1f MiB of %s MiB\n' \
    "$archive" "$(awk -v b="$arch" 'BEGIN { print b / 1048576 }')" "$(du -sh "$bundle" | cut -f1)" \
    "${need:-no GLIBC version}" "$(awk -v b="$tree" 'BEGIN { print b / 1048576 }')" \
    "$(awk -v b="$arch" 'BEGIN { print b / 1048576 }')" "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')" "$max_mib"
if [ "$total" -gt $((max_mib * 1048576)) ]; then
    rm -f "$archive"
    echo "gpu-bundle: refused: the tree and the archive are over $max_mib MiB (the device carries 64 MiB)" >&2
    exit 1
fi
