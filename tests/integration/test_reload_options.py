"""Every config option, changed one at a time on a running daemon and reloaded (the admin reload
op): each is applied live, loads its model again, or is refused as needing a restart, by name, as
`gpuswapd options` (the schema) says; the daemon keeps answering throughout."""
import copy
import os
import re
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-reloadopts-")
SHAPE = "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300"
M0 = gsd.mkmodel(os.path.join(TMP, "m0.gguf"), SHAPE + " --seed 1")
M0B = gsd.mkmodel(os.path.join(TMP, "m0b.gguf"), SHAPE.replace("--layers 2", "--layers 3") + " --seed 2")
M1 = gsd.mkmodel(os.path.join(TMP, "m1.gguf"), SHAPE + " --seed 3")
MKLORA = os.path.abspath(os.path.join(gsd.BUILD, "mklora"))
A0 = os.path.join(TMP, "a0.gguf")  # an adapter of m0 (and of m1: the same shape)
A1 = os.path.join(TMP, "a1.gguf")
for _path, _seed in ((A0, 1), (A1, 2)):
    subprocess.run([MKLORA, "--base", M0, "--out", _path, "--seed", str(_seed)], check=True,
                   capture_output=True)
ADAPTER_OPTS = ("models.base", "models.adapter", "models.adapter_scale")  # set on the adapter
HASH_A = "sha256:" + "a" * 64
HASH_B = "sha256:" + "b" * 64


def schema():
    """(option, class) of every row `gpuswapd options` prints."""
    out = subprocess.run([gsd.GPUSWAPD, "options"], capture_output=True, text=True, check=True).stdout
    rows = re.findall(r"^\| `([a-z_.]+)` \|[^|]*\|[^|]*\| (live|reloads the model|restart) \|", out, re.M)
    assert len(rows) > 50, out[:500]
    return rows


def base_config():
    return {
        "listen": {"socket": os.path.join(TMP, "s.sock")},
        "admin": {"socket": os.path.join(TMP, "a.sock")},
        "device": {"backend": "sim", "memory": "8MiB", "page_size": "64KiB", "threads": 1},
        "auth": {"keys": [{"name": "k1", "hash": HASH_A, "models": ["*"]}]},
        "models": [{"name": "m0", "path": M0, "defaults": {}},
                   {"name": "ad0", "base": "m0", "adapter": A0}],
    }


# The new value of each option (a valid one: a refused reload must be refused for the restart,
# not for the value). An option the schema gains without a value here fails the test.
CHANGE = {
    "listen.socket": os.path.join(TMP, "s2.sock"), "listen.mode": "0666",
    "listen.tcp": "127.0.0.1:%d" % gsd.free_port(), "listen.http": "127.0.0.1:%d" % gsd.free_port(),
    "listen.max_line": "2MiB", "listen.max_connections": 100, "listen.drain_linger": "1s",
    "admin.socket": os.path.join(TMP, "a2.sock"), "admin.mode": "0640", "admin.uids": [4242],
    "admin.gids": [4242],
    "device.backend": "cpu", "device.gpu": 1, "device.memory": "16MiB", "device.page_size": "128KiB",
    "device.sim_bandwidth": "1GiB", "device.sim_load_bandwidth": "1GiB", "device.threads": 2,
    "device.copy_timeout": "10s", "device.fault_injection": True, "device.prefill_chunk": 256,
    "host.memory": "1GiB",
    "host.kv_cache": "64MiB",
    "scheduler.policy": "fifo", "scheduler.max_batch": 8, "scheduler.max_wait": "1s",
    "scheduler.max_stall": "250ms", "scheduler.quantum": 2, "scheduler.queue_limit": 100, "scheduler.prefix_cache": False,
    "scheduler.max_queued": 1000, "scheduler.drain_timeout": "10s",
    "metrics.listen": "127.0.0.1:%d" % gsd.free_port(), "metrics.vllm_compat": True,
    "log.level": "debug",
    "auth.http": True, "auth.tcp": True, "auth.trusted_proxies": ["10.0.0.1"], "auth.max_failures": 3,
    "auth.backoff": "2s", "auth.keys": "+key", "auth.keys.name": "k1b", "auth.keys.hash": HASH_B,
    "auth.keys.models": ["m0"], "auth.keys.rate": 5, "auth.keys.burst": 10,
    "auth.keys.max_concurrent": 4, "auth.keys.tokens_per_minute": 1000,
    "auth.keys.deadline": "3s", "auth.keys.class": "batch",
    "models": "+model", "models.name": "m1b", "models.path": M0B, "models.gpu_quota": "4MiB",
    "models.base": "m1b", "models.adapter": A1, "models.adapter_scale": 0.5,
    "models.kv_cache": "64KiB", "models.kv_type": "f32", "models.priority": 2, "models.pinned": True,
    "models.max_batch": 4, "models.prefix_cache": 4, "models.max_context": 256, "models.chat_template": "chatml",
    "models.tool_choice": "required",
    "models.deadline": "2s", "models.deadline_miss": "keep",
    "models.defaults.temperature": 0.5, "models.defaults.top_k": 10, "models.defaults.top_p": 0.9,
    "models.defaults.min_p": 0.1, "models.defaults.repeat_penalty": 1.1,
    "models.defaults.presence_penalty": 0.5, "models.defaults.frequency_penalty": 0.5,
    "models.defaults.max_tokens": 64,
}


def apply_change(cfg, opt):
    """cfg with opt set to its new value; the model options go to the first model (models.name to
    the last: the one `models` added), key options to the first key."""
    v = CHANGE[opt]
    parts = opt.split(".")
    if opt in ("auth.http", "auth.tcp"):  # a key on a listener: it takes the listener too
        cfg["listen"][parts[1]] = CHANGE["listen." + parts[1]]
    if opt == "auth.keys":
        cfg["auth"]["keys"].append({"name": "k2", "hash": HASH_B.replace("b", "c"), "models": ["*"]})
    elif opt == "models":
        cfg["models"].append({"name": "m1", "path": M1})
    elif parts[:2] == ["auth", "keys"]:
        cfg["auth"]["keys"][0][parts[2]] = v
    elif opt in ADAPTER_OPTS:
        [m for m in cfg["models"] if m["name"] == "ad0"][0][parts[1]] = v
    elif parts[0] == "models":
        m = cfg["models"][-1 if opt == "models.name" else 0]
        if len(parts) == 3:
            m.setdefault(parts[1], {})[parts[2]] = v
        else:
            m[parts[1]] = v
    else:
        cfg.setdefault(parts[0], {})[parts[1]] = v
    return cfg


def expect(opt, cls, ans):
    """What the reload answer must say for opt of class cls: (ok, what it said)."""
    if cls == "restart":
        msg = ans.get("error", {}).get("message", "")
        return ans.get("error", {}).get("code") == "bad_request" and \
            ("%s cannot change on reload" % opt) in msg, msg
    res = ans.get("result", ans)
    if "error" in ans:
        return False, ans["error"]
    if opt == "models":
        return res["added"] == ["m1"], res
    if opt == "models.name":
        return res["added"] == ["m1b"] and res["removed"] == ["m1"], res
    if opt.startswith("models."):
        key, name = opt[len("models."):], "ad0" if opt in ADAPTER_OPTS else "m0"
        keys = res["changed_keys"].get(name, [])
        reloaded = name in res["reloaded"]
        if opt in ADAPTER_OPTS and "m0" in res["reloaded"] + res["changed"]:
            return False, res  # the adapter alone: its base is untouched
        return key in keys and reloaded == (cls == "reloads the model"), res
    name = "auth.keys" if opt.startswith("auth.keys") else opt
    return name in res["settings"] and not res["reloaded"], res


def main():
    rows = schema()
    missing = [o for o, _ in rows if o not in CHANGE]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
        passed, failed = passed + bool(ok), failed + (not ok)

    check(not missing, "every option of the schema has a test value (missing: %s)" % missing)
    cur = base_config()
    # started on gsd's config (the same sockets and device), replaced before the first reload
    d = gsd.Daemon([("m0", M0, "")], memory="8MiB", page="64KiB", tmp=TMP)
    counts = {}
    try:
        c = d.client()
        with open(d.config, "w") as f:
            yaml.safe_dump(cur, f)
        ans = d.admin_call({"op": "reload", "id": "base"})
        check("error" not in ans, "the base config reloads: %s" % ans)
        weights0 = [m for m in d.admin_call({"op": "models", "id": "m"})["models"]
                    if m["name"] == "m0"][0]["weight_bytes"]
        for opt, cls in rows:
            if opt not in CHANGE:
                continue
            nxt = apply_change(copy.deepcopy(cur), opt)
            with open(d.config, "w") as f:
                yaml.safe_dump(nxt, f)
            ans = d.admin_call({"op": "reload", "id": opt})
            ok, said = expect(opt, cls, ans)
            check(ok, "%s (%s): %s" % (opt, cls, said if not ok else "as the schema says"))
            counts[cls] = counts.get(cls, 0) + 1
            if "error" not in ans:
                cur = nxt
            if cls == "reloads the model":  # it serves from its new load
                name = "ad0" if opt in ADAPTER_OPTS else "m0"
                ev = c.call({"op": "generate", "id": "g-" + opt, "model": name, "tokens": [5, 6],
                             "max_tokens": 2, "temperature": 0})
                check(ev.get("event") == "done", "%s answers after %s loaded it again: %s" % (name, opt, ev))
        st = d.admin_call({"op": "models", "id": "m"})
        m0 = [m for m in st["models"] if m["name"] == "m0"][0]
        got = {k: m0.get(k) for k in ("priority", "pinned", "gpu_quota")}
        check(got == {"priority": 2, "pinned": True, "gpu_quota": 4 << 20},
              "m0 runs with the reloaded priority, pin and quota: %s" % got)
        check(m0.get("weight_bytes", 0) > weights0,
              "m0 runs the file models.path named (3 layers: %s bytes, was %d)" % (m0.get("weight_bytes"), weights0))
        c.close()
    finally:
        rc = d.stop()
    check(rc == 0, "the daemon stops cleanly (%d)" % rc)
    print("classes: %s" % ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items())))
    shutil.rmtree(TMP, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
