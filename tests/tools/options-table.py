#!/usr/bin/python3
"""The README's option table against the schema (`gpuswapd options`, config/cfg_schema.c).

  options-table.py GPUSWAPD [README] [--write]

The table sits between the lines `<!-- options:begin -->` and `<!-- options:end -->`. Without
--write: exit 1 naming the first differing line when it is not what `GPUSWAPD options` prints
(or the markers are missing); with --write: rewrites the block (`make options`). Standard library only.
"""
import subprocess
import sys

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = "--write" in sys.argv[1:]
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    binary, readme = args[0], (args[1] if len(args) > 1 else "README.md")
    try:
        table = subprocess.run([binary, "options"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print("check: options: cannot run %s options (make all builds it): %s" % (binary, e))
        return 1
    text = open(readme, encoding="utf-8").read()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        print("check: options: %s needs one %s ... %s block for the option table" % (readme, BEGIN, END))
        return 1
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    want = "\n" + table
    if body == want:
        return 0
    if write:
        with open(readme, "w", encoding="utf-8") as f:
            f.write(head + BEGIN + want + END + tail)
        print("options: %s: the option table rewritten from the schema" % readme)
        return 0
    have, need = body.split("\n"), want.split("\n")
    line = head.count("\n") + 1
    for i in range(max(len(have), len(need))):
        a = have[i] if i < len(have) else "(nothing)"
        b = need[i] if i < len(need) else "(nothing)"
        if a != b:
            print("check: options: %s:%d: the option table differs from the schema (make options "
                  "rewrites it):\n  README: %s\n  schema: %s" % (readme, line + i, a, b))
            return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
