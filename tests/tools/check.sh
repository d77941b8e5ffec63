#!/usr/bin/env bash
# `make check`: the source rules the compiler does not enforce. Usage: tests/tools/check.sh [ROOT]
# (default: the repository). Exits 1 naming every finding of:
#   layers    a daemon include against the layer order base -> kernels -> backend -> engine ->
#             proto/ and config/ -> daemon/worker and daemon/oneshot -> daemon/front (a file
#             includes only its own layer or those below), a daemon/ header included without its
#             layer's path, or a source file straight in daemon/ or in a folder not in the order
#   cuda      a CUDA header (cuda*.h, cublas*.h, nvml.h, ...) or a .cu/.cuh file outside
#             daemon/backend/cuda/
#   format    a `clang-format --dry-run` difference (.clang-format) in a C, header or CUDA file
#   unused    a `cppcheck --enable=unusedFunction` finding not listed in tests/tools/check-unused.txt
#   tables    a Markdown table (rows starting with '|', outside code fences) that does not open
#             with a header row and a delimiter row of as many cells, so it would not render
#   folder-cycles  a cycle among the folders under daemon/ proto/ config/ clients/ (each one a node,
#             daemon/ apart from daemon/engine) by `#include "..."` (tests/tools/cycles.py)
#   size      a production file (daemon/ proto/ config/ clients/) over 1,200 lines or a function over
#             120 (tests/tools/sizes.py)
#   options   README.md's option table (between <!-- options:begin --> and <!-- options:end -->)
#             not what `$BUILD/gpuswapd options` prints from the schema (tests/tools/options-table.py;
#             `make options` rewrites it)
#   file-cycles    a cycle among the production .c/.cu files by the global symbols their objects
#             ($BUILD/obj, default build/; `nm`) define and use: a call through a function pointer
#             is no edge. Reads the objects, builds none: `make check` makes them first; CHECK_CUDA=1
#             requires the .cu ones, 0 leaves them out, unset uses them when there.
#             Both accept the cycles tests/tools/check-cycles.txt lists and fail on a listed one gone.
# CHECK_ONLY="layers cuda" runs some of them.
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
only=${CHECK_ONLY:-layers cuda format unused tables size options folder-cycles file-cycles}
fail=0
say() { echo "check: $*"; fail=1; }

# The C, header and CUDA files the rules look at: git's when this is a checkout, else all.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$(git rev-parse --show-toplevel)" = "$PWD" ]; then
    files=$(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh')
    docs=$(git ls-files --cached --others --exclude-standard -- '*.md')
else
    files=$(find daemon proto config clients tests -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort)
    docs=$(find . -name '*.md' -not -path '*/node_modules/*' | sed 's|^\./||' | sort)
fi

layer_of() { # path -> rank, or empty for files outside the daemon's layers
    case $1 in
    daemon/base/*) echo 0 ;;
    daemon/kernels/*) echo 1 ;;
    daemon/backend/*) echo 2 ;;
    daemon/engine/*) echo 3 ;;
    proto/* | config/*) echo 4 ;;
    daemon/worker/* | daemon/oneshot/*) echo 5 ;;
    daemon/front/*) echo 6 ;;
    daemon/*) echo 9 ;; # straight in daemon/, or a folder not in the order
    esac
}

if [[ " $only " == *" layers "* ]]; then
    for f in $files; do
        me=$(layer_of "$f")
        [ -n "$me" ] || continue
        [ "$me" = 9 ] && { say "layers: $f: not in a layer folder (daemon/ holds base kernels backend engine worker oneshot front)"; continue; }
        dir=$(dirname "$f")
        while IFS=: read -r line inc; do
            # resolve as the compiler does: next to the file, then -iquote daemon, proto, config;
            # a bare name found only inside a layer's folder is one written without its path
            target= how=
            if [ -f "$dir/$inc" ]; then target=$dir/$inc how=local
            elif [ -f "daemon/$inc" ]; then target=daemon/$inc how=path
            elif [ -f "proto/$inc" ]; then target=proto/$inc how=path
            elif [ -f "config/$inc" ]; then target=config/$inc how=path
            else
                for l in base kernels backend engine backend/cuda worker oneshot front; do
                    [ -f "daemon/$l/$inc" ] && { target=daemon/$l/$inc how=bare; break; }
                done
            fi
            [ -n "$target" ] || continue # a system or generated header
            target=$(realpath -m --relative-to=. "$target")
            them=$(layer_of "$target")
            [ -n "$them" ] || continue
            if [ "$them" -gt "$me" ]; then
                say "layers: $f:$line: includes \"$inc\" ($target), a layer above it"
            elif [ "$how" = bare ] || { [ "$how" = local ] && [ "$(dirname "$target")" != "$dir" ] &&
                                          [ "$inc" != "${target#daemon/}" ]; }; then
                say "layers: $f:$line: \"$inc\" must be written with its layer's path (\"${target#daemon/}\")"
            fi
        done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed -E 's/^([0-9]+):.*"([^"]+)".*/\1:\2/')
    done
fi

if [[ " $only " == *" cuda "* ]]; then
    for f in $files; do
        case $f in daemon/backend/cuda/*) continue ;; esac
        case $f in *.cu | *.cuh) say "cuda: $f: CUDA source outside daemon/backend/cuda/" ;; esac
        grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](cuda|cublas|cudart|curand|cusparse|nvml|nvrtc|driver_types|vector_types)[A-Za-z0-9_]*\.h[>"]' "$f" |
            while IFS=: read -r line _; do
                echo "check: cuda: $f:$line: CUDA header outside daemon/backend/cuda/"
            done | grep . && fail=1
    done
fi

if [[ " $only " == *" format "* ]]; then
    if ! command -v clang-format >/dev/null; then
        say "format: clang-format not found (make deps)"
    else
        out=$(echo "$files" | xargs -r clang-format --dry-run 2>&1 |
              grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error): ' | cut -d: -f1,2 | sort -u)
        if [ -n "$out" ]; then
            n=$(echo "$out" | wc -l)
            say "format: $n places differ from .clang-format (make format fixes them), first ones:"
            echo "$out" | head -10 | sed 's/^/  /'
        fi
    fi
fi

if [[ " $only " == *" unused "* ]]; then
    if ! command -v cppcheck >/dev/null; then
        say "unused: cppcheck not found (make deps)"
    else
        src=$(echo "$files" | grep -E '^(daemon|proto|config|clients)/.*\.c$')
        found=$(cppcheck --enable=unusedFunction --quiet --template='{id} {message}' -D__GNUC__ -DGPUSWAPD_CUDA \
                    --language=c --std=c11 -I daemon -I proto -I config -I clients $src 2>&1 |
                grep '^unusedFunction' | sed -E "s/.*function '([^']+)'.*/\1/" | sort -u)
        expected=$(grep -vE '^[[:space:]]*(#|$)' tests/tools/check-unused.txt 2>/dev/null | awk '{print $1}' | sort -u)
        extra=$(comm -23 <(echo "$found") <(echo "$expected") | grep .)
        [ -n "$extra" ] && say "unused: functions nothing calls (remove them, or list them in tests/tools/check-unused.txt with why): $(echo $extra)"
    fi
fi

if [[ " $only " == *" tables "* ]]; then
    for f in $docs; do
        # a run of '|' lines is one table: its first line the header, its second the delimiter
        # (| --- | :-: |) with as many cells; cells split at '|' not escaped as '\|'
        awk -v f="$f" '
            function cells(s) { gsub(/\\\|/, "", s); sub(/^[ \t]*\|/, "", s); sub(/\|[ \t]*$/, "", s); return split(s, _, "|") }
            /^[ \t]*(```|~~~)/ { fence = !fence; run = 0; next }
            fence { next }
            /^[ \t]*\|/ {
                run++
                if (run == 1) { head = NR; n = cells($0) }
                else if (run == 2) {
                    if ($0 !~ /^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/)
                        printf "check: tables: %s:%d: table rows without a header and delimiter row (| a | b |, then | --- | --- |)\n", f, head
                    else if (cells($0) != n)
                        printf "check: tables: %s:%d: the header has %d cells, its delimiter row %d\n", f, head, n, cells($0)
                }
                next
            }
            { if (run == 1) printf "check: tables: %s:%d: a lone table row, without a delimiter row\n", f, head; run = 0 }
            END { if (run == 1) printf "check: tables: %s:%d: a lone table row, without a delimiter row\n", f, head }
        ' "$f"
    done | grep . && fail=1
fi

if [[ " $only " == *" size "* ]]; then
    echo "$files" | /usr/bin/python3 tests/tools/sizes.py || fail=1
fi

if [[ " $only " == *" options "* ]]; then
    /usr/bin/python3 tests/tools/options-table.py "${BUILD:-build}/gpuswapd" README.md || fail=1
fi

if [[ " $only " == *" folder-cycles "* ]]; then
    echo "$files" | /usr/bin/python3 tests/tools/cycles.py folders || fail=1
fi

if [[ " $only " == *" file-cycles "* ]]; then
    echo "$files" | /usr/bin/python3 tests/tools/cycles.py files --build "${BUILD:-build}" --cuda "${CHECK_CUDA:-}" || fail=1
fi

[ "$fail" = 0 ] && echo "check: ok ($only)"
exit "$fail"
