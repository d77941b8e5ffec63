#!/usr/bin/python3
"""Prints a runner's closing `skipped: N (names and reasons)` line; under CI=true fails on a skip of a
kind that is not allowed there. Input: a Criterion --json report, or (with -) `name<TAB>reason`
lines on stdin."""
import json
import os
import re
import sys

# The skips a CI run may have: what the machine lacks, never what the project failed to ship.
ALLOWED = [
    ("no GPU", re.compile(r"no CUDA|no GPU|CUDA driver|nvidia", re.I)),
    ("CPU lacks the path", re.compile(r"CPU (lacks|has no)", re.I)),
    ("tool not installed", re.compile(r"not installed|not on PATH", re.I)),
    ("kernel lacks the feature", re.compile(r"kernel lacks", re.I)),
]


def kind(reason):
    return next((k for k, rx in ALLOWED if rx.search(reason)), None)


def from_criterion(path):
    try:
        rep = json.load(open(path))
    except json.JSONDecodeError as e:
        # Criterion writes a failed assertion's message unescaped: the failures above say what failed
        sys.exit("skips: %s is not valid JSON (%s), most likely a failure message with quotes; "
                 "skips not listed" % (path, e))
    for suite in rep["test_suites"]:
        for t in suite["tests"]:
            if t["status"] == "SKIPPED":
                msg = (t.get("messages") or ["(no reason given)"])[0]
                yield "%s::%s" % (suite["name"], t["name"]), msg


def from_lines(f):
    for line in f:
        name, _, reason = line.rstrip("\n").partition("\t")
        if name:
            yield name, reason or "(no reason given)"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: skips.py CRITERION.json | -")
    skips = list(from_lines(sys.stdin) if sys.argv[1] == "-" else from_criterion(sys.argv[1]))
    by_reason = {}
    for name, reason in skips:
        by_reason.setdefault(reason, []).append(name)
    parts = ["%s: %s" % (reason, ", ".join(names)) for reason, names in by_reason.items()]
    print("skipped: %d%s" % (len(skips), " (%s)" % "; ".join(parts) if parts else ""))
    ci = os.environ.get("CI", "") not in ("", "false", "0")
    bad = [(n, r) for n, r in skips if kind(r) is None]
    if ci and bad:
        for n, r in bad:
            print("FAIL: %s skipped under CI=true, a kind that is not allowed: %s" % (n, r))
        print("allowed skip kinds: %s" % ", ".join(k for k, _ in ALLOWED))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
