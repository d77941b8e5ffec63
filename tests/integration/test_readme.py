"""Runs the README's newcomer session as written against `make run`'s daemon (tests/tools/demo.sh)."""
import os
import re
import shlex
import subprocess
import sys
import time

BUILD = os.environ.get("GPUSWAPD_BUILD", "build")


def session_commands():
    text = open("README.md").read()
    block = re.search(r"<!-- newcomer-session -->\s*```sh\n(.*?)```", text, re.S).group(1)
    return [l for l in block.splitlines() if l.strip() and not l.startswith("#")]


def main():
    # the README speaks of build/; another build (build-asan) runs the same session on its binaries
    cmds = [re.sub(r"(?<![\w/.-])build/", BUILD + "/", c) for c in session_commands()]
    log = open(os.path.join(BUILD, "demo-readme.log"), "w")
    demo = subprocess.Popen(["bash", "tests/tools/demo.sh", BUILD], stdout=log, stderr=subprocess.STDOUT)
    sock = os.path.join(BUILD, "demo/run/gpuswapd.sock")
    deadline = time.time() + 60
    while not os.path.exists(sock) and time.time() < deadline and demo.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)  # let the warm-up traffic land
    env = dict(os.environ)
    passed = failed = 0
    for c in cmds:
        if c.startswith("export "):
            for kv in shlex.split(c[len("export "):]):
                k, v = kv.split("=", 1)
                env[k] = v
            continue
        p = subprocess.run(["bash", "-o", "pipefail", "-c", c], env=env, capture_output=True, text=True,
                           timeout=60)
        ok = p.returncode == 0 and (p.stdout.strip() or "drain" in c or "promtool" in c)
        if "/v1/" in c and "error" in p.stdout[:200]:
            ok = False
        print("%s %s" % ("ok  " if ok else "FAIL", c[:100]))
        if not ok:
            print("   rc=%d stdout=%r stderr=%r" % (p.returncode, p.stdout[-500:], p.stderr[-500:]))
        passed += bool(ok)
        failed += not ok
    try:
        rc = demo.wait(30)
    except subprocess.TimeoutExpired:
        demo.kill()
        rc = -1
    ok = rc == 0
    print("%s daemon exited %d after drain" % ("ok  " if ok else "FAIL", rc))
    passed += ok
    failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
