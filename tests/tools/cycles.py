#!/usr/bin/python3
"""`make check`'s two cycle rules, run by tests/tools/check.sh from the repository root.

  cycles.py folders [--allow FILE] [--all]  [< source paths]
      the graph of folders by `#include "..."` between the source files (.c .h .cu .cuh) under
      daemon/, proto/, config/ and clients/: each folder holding one is a node of its own
      (daemon/ is its own files, daemon/engine another node; new folders count as they appear),
      so proto/ and config/ may sit above daemon/engine and below daemon/. An include resolves
      as the compiler does: next to the file, then the Makefile's -iquote folders in order.
  cycles.py files [--build DIR] [--cuda 0|1] [--allow FILE] [--all]  [< source paths]
      the graph of production files (.c .cu under daemon/, proto/, config/, clients/) by the
      symbols their objects DIR/obj/<file>.o define and use (`nm`): an edge a -> b when a's object
      leaves undefined a global symbol that b's object defines. Calls through function pointers
      leave no undefined symbol, so a vtable or a sink is no edge. --cuda 1: the .cu objects must
      be there (the Makefile passes it when it builds them); 0: they are left out; unset: used
      when present.

Both fail (exit 1) naming each cycle (a strongly connected component of more than one node) with
one example include or symbol per edge, unless FILE (tests/tools/check-cycles.txt) lists it as
"folders|files <its members, sorted>"; a listed cycle that no longer exists fails too, so the list
only shrinks. --all prints every cycle in that form, with its edges, and exits 0. Without a list
on stdin (a terminal), the files git knows. Standard library only.
"""
import argparse
import os
import re
import subprocess
import sys
from collections import defaultdict, deque

TOPS = ("daemon", "proto", "config", "clients")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
DEFINED = set("TDBRCGSVWiu")  # nm: text, data, bss, read-only, common, small, weak, indirect, unique
UNDEFINED = set("Uwv")


# ---------------------------------------------------------------- graphs


def sccs(nodes, edges):
    """Strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = n[0]
        n[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def shortest_cycle(comp, edges, start):
    """A shortest cycle through start, a member of the component, as a list of nodes (start twice)."""
    inside = set(comp)
    prev, q = {start: None}, deque([start])
    while q:
        v = q.popleft()
        for w in sorted(edges.get(v, ())):
            if w not in inside:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                q.append(w)
    return comp + [comp[0]]  # not reached: a component's members reach each other


def report(kind, rule, noun, nodes, edges, why, args):
    """Prints the cycles not allowed and the allowed ones that are gone; returns the exit status."""
    comps = sccs(nodes, edges)
    keys = {" ".join([kind] + c): c for c in comps}
    if args.all:
        for key, comp in keys.items():
            print(key)
            for a in comp:
                for b in sorted(edges.get(a, ())):
                    if b in comp:
                        print("  %s -> %s: %s" % (a, b, why[a, b]))
        return 0
    allowed = {}
    if args.allow and os.path.exists(args.allow):
        with open(args.allow) as f:
            for i, line in enumerate(f, 1):
                line = line.split("#", 1)[0].split()
                if line and line[0] == kind:
                    allowed[" ".join([line[0]] + sorted(line[1:]))] = i
    fail = 0
    for key, comp in keys.items():
        if key in allowed:
            continue
        fail = 1
        # through a member new to the cycle, where it grew out of a listed one
        old = set().union(*[set(k.split()[1:]) for k in allowed if set(k.split()[1:]) <= set(comp)])
        cyc = shortest_cycle(comp, edges, next((m for m in comp if m not in old), comp[0]))
        print("check: %s: %s cycle: %s (%s)" % (rule, noun, " -> ".join(cyc),
              "; ".join(why[a, b] for a, b in zip(cyc, cyc[1:]))))
        if len(comp) > len(cyc) - 1:
            print("check: %s:   its %d %ss reach each other by these edges:" % (rule, len(comp), noun))
            for a in comp:
                for b in sorted(edges.get(a, ())):
                    if b in comp:
                        print("check: %s:     %s -> %s: %s" % (rule, a, b, why[a, b]))
    for key, line in sorted(allowed.items(), key=lambda kv: kv[1]):
        if key in keys:
            continue
        fail = 1
        members = set(key.split()[1:])
        now = [k for k, c in keys.items() if members & set(c)]
        print("check: %s: %s:%d: '%s' is no longer a cycle: delete the line%s" % (
            rule, args.allow, line, key, " (its folders or files are now in: %s)" % "; ".join(
                "'%s'" % k for k in now) if now else ""))
    return fail


# ---------------------------------------------------------------- folders by includes


def iquote_dirs(makefile="Makefile"):
    """The -iquote folders of the Makefile's compiler flags, in order."""
    with open(makefile) as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^CFLAGS_ALL\s*:?=(.*)$", text, re.M)
    if not m:
        sys.exit("cycles.py: no CFLAGS_ALL in %s" % makefile)
    return re.findall(r"-iquote\s+(\S+)", m.group(1))


def in_tops(path):
    return path.split("/", 1)[0] in TOPS


def folders(paths, args):
    search = iquote_dirs()
    srcs = [p for p in paths if in_tops(p) and p.endswith((".c", ".h", ".cu", ".cuh"))]
    nodes = {os.path.dirname(p) for p in srcs}
    edges, why = defaultdict(set), {}
    for src in srcs:
        here = os.path.dirname(src)
        with open(src, errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                for d in [here] + search:
                    target = os.path.normpath(os.path.join(d, inc))
                    if os.path.isfile(target):
                        break
                else:
                    continue  # a system or generated header
                there = os.path.dirname(target)
                if there == here or there not in nodes:
                    continue  # within one folder, or outside those the rule looks at (tests/)
                edges[here].add(there)
                why.setdefault((here, there), '%s:%d includes "%s" = %s' % (src, n, inc, target))
    return report("folders", "folder-cycles", "folder", nodes, edges, why, args)


# ---------------------------------------------------------------- files by symbols


def files(paths, args):
    srcs = sorted(p for p in paths if in_tops(p) and p.endswith((".c", ".cu")))
    objs, missing = {}, []
    for src in srcs:
        obj = os.path.join(args.build, "obj", os.path.splitext(src)[0] + ".o")
        if os.path.isfile(obj):
            objs[src] = obj
        elif src.endswith(".cu") and args.cuda != "1":
            continue  # no nvcc build: the CUDA objects are not made
        else:
            missing.append(obj)
    if missing:
        print("check: file-cycles: %d objects missing (make all builds them; make check does first): %s" % (
            len(missing), " ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")))
        return 1
    if args.cuda == "0":
        objs = {s: o for s, o in objs.items() if not s.endswith(".cu")}
    if not objs:
        return 0
    out = subprocess.run(["nm", "-P", "-A"] + sorted(objs.values()), capture_output=True, text=True)
    if out.returncode != 0:
        print("check: file-cycles: nm failed: %s" % out.stderr.strip()[:300])
        return 1
    src_of = {o: s for s, o in objs.items()}
    strong, weak, uses = defaultdict(set), defaultdict(set), defaultdict(set)
    for line in out.stdout.splitlines():
        # -P -A: "file.o: name type [value size]"
        head, _, rest = line.partition(": ")
        f = rest.split()
        if len(f) < 2 or head not in src_of:
            continue
        name, t, src = f[0], f[1], src_of[head]
        if t in UNDEFINED:
            uses[src].add(name)
        elif t in DEFINED:
            (weak if t in "VW" else strong)[name].add(src)
    edges, why = defaultdict(set), {}
    for a in sorted(uses):
        for sym in sorted(uses[a]):
            for b in sorted(strong.get(sym) or weak.get(sym) or ()):
                if b != a:
                    edges[a].add(b)
                    why.setdefault((a, b), "%s uses %s from %s" % (a, sym, b))
    return report("files", "file-cycles", "file", set(objs), edges, why, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rule", choices=["folders", "files"])
    ap.add_argument("--allow", default="tests/tools/check-cycles.txt")
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--cuda", choices=["0", "1", ""], default="")
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    if sys.stdin.isatty():  # run by hand: the files git knows
        lines = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, text=True).stdout.splitlines()
    else:
        lines = sys.stdin
    paths = sorted({p.strip() for p in lines if p.strip()})
    sys.exit((folders if args.rule == "folders" else files)(paths, args))


if __name__ == "__main__":
    main()
