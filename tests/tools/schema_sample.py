#!/usr/bin/python3
"""Builds tests/data/schemas/jsonschemabench-sample.json from a clone of guidance-ai/jsonschemabench:
from each of the subsets below, the files of at most 4096 bytes in path order, N of them evenly
spaced. Usage: schema_sample.py CLONE_DIR OUT.json [N]"""
import hashlib
import json
import os
import subprocess
import sys

SUBSETS = ("Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow")  # sources under Apache-2.0
MAX_BYTES = 4096


def git(clone, *args):
    return subprocess.run(["git", "-C", clone] + list(args), capture_output=True, check=True).stdout


def main():
    clone, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    commit = git(clone, "rev-parse", "HEAD").decode().strip()
    entries = []
    for sub in SUBSETS:
        rows = []
        for line in git(clone, "ls-tree", "-r", "-l", "HEAD", "data/%s/" % sub).decode().splitlines():
            meta, path = line.split("\t", 1)
            _, _, blob, size = meta.split()
            if size.isdigit() and int(size) <= MAX_BYTES:  # a clone without its largest blobs lists them as BAD
                rows.append((path, blob))
        rows.sort()
        for i in range(n):
            path, blob = rows[i * len(rows) // n]
            raw = git(clone, "cat-file", "blob", blob)
            entries.append({"id": path[len("data/"):], "git_blob": blob,
                            "sha256": hashlib.sha256(raw).hexdigest(), "schema": json.loads(raw)})
    doc = {"origin": "https://github.com/guidance-ai/jsonschemabench", "commit": commit,
           "license": "MIT (JSONSchemaBench, the epfl-dlab/JSONSchemaBench dataset card); the schemas' "
                      "sources are under Apache-2.0 (tests/data/README.md)",
           "selection": "per subset, files of at most %d bytes in path order, %d evenly spaced" % (MAX_BYTES, n),
           "schemas": entries}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("%s: %d schemas from %s" % (out, len(entries), commit), file=sys.stderr)


if __name__ == "__main__":
    main()
