"""tests/data holds exactly the files its README lists, each with the listed size and sha256, and
less than 50 MB in all."""
import hashlib
import os
import re
import sys

DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")


def main():
    listed = {}
    for m in re.finditer(r"^\| `([^`]+)` \| (\d+) \| `([0-9a-f]{64})` \|$", open(os.path.join(DATA, "README.md")).read(),
                         re.M):
        listed[m.group(1)] = (int(m.group(2)), m.group(3))
    present = set()
    for root, _, files in os.walk(DATA):
        for f in files:
            present.add(os.path.relpath(os.path.join(root, f), DATA))
    present.discard("README.md")
    bad = ["not listed in README.md: %s" % f for f in sorted(present - set(listed))]
    bad += ["listed but missing: %s" % f for f in sorted(set(listed) - present)]
    total = 0
    for f in sorted(present & set(listed)):
        data = open(os.path.join(DATA, f), "rb").read()
        total += len(data)
        size, sha = listed[f]
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            bad.append("%s: %d bytes, sha256 %s; README says %d, %s" % (f, len(data), hashlib.sha256(data).hexdigest(),
                                                                       size, sha))
    if total >= 50e6:
        bad.append("test data is %.1f MB, over the 50 MB budget" % (total / 1e6))
    for b in bad:
        print("FAIL " + b)
    print("%d files, %.1f MB, every sha256 as listed" % (len(listed), total / 1e6) if not bad else "")
    print("%d passed, %d failed" % (0 if bad else 1, 1 if bad else 0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
