#!/usr/bin/python3
"""`make check`'s size rule, run by tests/tools/check.sh from the repository root.

  sizes.py [--max-lines N] [--max-function N] [--all]  < source paths

Reads the production files named on stdin (.c .h .cu .cuh under daemon/, proto/, config/ and
clients/; tests and generated data are not production) and fails (exit 1) naming each file over N
lines (default 1200) and each function over N lines (default 120), counted from the first line of
its signature to its closing brace. A function is what the house style (clang-format) writes: a
signature starting at column 0 and its body's braces alone at column 0. --all prints the ten
largest of each and exits 0. Standard library only.
"""
import argparse
import re
import sys

TOPS = ("daemon/", "proto/", "config/", "clients/")
SRC = re.compile(r"\.(c|h|cu|cuh)$")
STARTS = re.compile(r"^[A-Za-z_]")  # a declaration at column 0 (not '#', '}', a comment or blank)


def functions(lines):
    """(name, first line, length) of each function body in lines."""
    out = []
    for i, line in enumerate(lines):
        if line.rstrip() != "{" or i == 0:
            continue
        start = i - 1  # the signature: back to the line at column 0 that starts it
        while start > 0 and not STARTS.match(lines[start]):
            start -= 1
        sig = " ".join(lines[start:i])
        if not STARTS.match(lines[start]) or "(" not in sig or re.match(r"^(typedef|struct|enum|union)\b", sig) \
                or "=" in sig.split("(")[0]:
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "}":
            end += 1
        name = re.findall(r"(\w+)\s*\(", sig.split("(")[0] + "(")
        out.append((name[-1] if name else "?", start + 1, end - start + 1))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-lines", type=int, default=1200)
    ap.add_argument("--max-function", type=int, default=120)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    paths = [p for p in sys.stdin.read().split() if p.startswith(TOPS) and SRC.search(p)]
    big_files, big_funcs = [], []
    for p in paths:
        try:
            lines = open(p, encoding="utf-8", errors="replace").read().split("\n")
        except OSError:
            continue
        n = len(lines) - (1 if lines and lines[-1] == "" else 0)
        big_files.append((n, p))
        for name, at, length in functions(lines):
            big_funcs.append((length, "%s:%d" % (p, at), name))
    big_files.sort(reverse=True)
    big_funcs.sort(reverse=True)
    if a.all:
        for n, p in big_files[:10]:
            print("file %5d %s" % (n, p))
        for n, at, name in big_funcs[:10]:
            print("function %4d %s %s" % (n, at, name))
        return 0
    fail = 0
    for n, p in big_files:
        if n > a.max_lines:
            print("check: size: %s: %d lines, more than %d: split it by concern" % (p, n, a.max_lines))
            fail = 1
    for n, at, name in big_funcs:
        if n > a.max_function:
            print("check: size: %s: %s is %d lines, more than %d: break it into named steps"
                  % (at, name, n, a.max_function))
            fail = 1
    return fail


if __name__ == "__main__":
    sys.exit(main())
