"""LoRA adapters in the daemon (issue 46, sim backend): three small bases and 50 adapters in one
pool; each adapter answers by its own name as `gpuswapd generate --lora` does, in batches of its
base, each adapter paged onto the device for its requests and evicted when idle under pressure;
evicting a base evicts its adapters, which page back in with it; a reload adds an adapter while its
base streams; a bad adapter is failed with the reason while the others serve; /v1/models lists each
adapter with its base and /metrics its counters; 300 adapters (no fixed limit) and an adapter's
gpu_quota."""
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-lora-daemon-")
MKLORA = os.path.abspath(os.path.join(gsd.BUILD, "mklora"))
SMALL = "--type f16 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300"
PROMPT = "Once upon a time"
N = 8  # tokens per answer

BASES = [("b%d" % i, gsd.mkmodel(os.path.join(TMP, "b%d.gguf" % i),
                                 ("--arch qwen2 " if i == 2 else "") + SMALL + " --seed %d" % (i + 1)))
         for i in range(3)]


def mklora(base, out, seed, targets="q,k,v,o"):
    subprocess.run([MKLORA, "--base", base, "--out", out, "--rank", "8", "--targets", targets,
                    "--type", "f16", "--seed", str(seed)], check=True, capture_output=True,
                   timeout=gsd.scaled(60))
    return out


# 50 adapters spread over the three bases
ADAPTERS = []
for k in range(50):
    bname, bpath = BASES[k % 3]
    ADAPTERS.append(("a%02d" % k, bname, bpath,
                     mklora(bpath, os.path.join(TMP, "a%02d.gguf" % k), 100 + k,
                            "q,k,v,o" if k % 2 else "q,v,o,up")))


def want(base_path, lora_path):
    """`gpuswapd generate` greedy text with the adapter (None: the base alone)."""
    cmd = [gsd.GPUSWAPD, "generate", "--model", base_path, "--prompt", PROMPT, "-n", str(N),
           "--temp", "0", "--json", "--quiet", "--threads", "1"]
    if lora_path:
        cmd += ["--lora", lora_path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=gsd.scaled(60))
    return json.loads(out.stdout.strip().splitlines()[-1])["text"]


def entries(adapters):
    return [(n, p, "") for n, p in BASES] + \
           [(name, None, "base: %s\nadapter: %s" % (b, path)) for name, b, _, path in adapters]


def gen(c, rid, model, max_tokens=N):
    return {"op": "generate", "id": rid, "model": model, "prompt": PROMPT, "max_tokens": max_tokens,
            "temperature": 0}


def models_of(d):
    return {m["name"]: m for m in d.admin_call({"op": "models", "id": "m"})["models"]}


def test_50_adapters_answer_as_generate_lora_in_their_bases_batches():
    d = gsd.Daemon(entries(ADAPTERS), memory="4MiB")
    try:
        c = d.client(timeout=60)
        names = [a[0] for a in ADAPTERS] + [b[0] for b in BASES]
        for n in names:  # all at once: the scheduler batches each base with its adapters
            c.send(gen(c, n, n))
        got = {}
        while len(got) < len(names):
            ev = c.recv()
            if ev.get("event") in ("done", "error"):
                got[ev["id"]] = ev
        for name, _, bpath, path in ADAPTERS:
            assert got[name].get("event") == "done", got[name]
            assert got[name]["text"] == want(bpath, path), (name, got[name]["text"])
        for name, bpath in BASES:
            assert got[name]["text"] == want(bpath, None), (name, got[name]["text"])
        st = d.stats()
        ad = st["adapters"]
        assert len(ad) == 50, sorted(ad)
        a0 = ad["a00"]
        assert a0["base"] == "b0" and a0["total_requests"] == 1, a0
        assert a0["total_generated_tokens"] == N and a0["total_failed"] == 0, a0
        assert a0["adapter_bytes"] > 0, a0
        # each adapter a paging unit of its own: paged in for its request; the 4 MiB pool
        # cannot hold 50 of them beside the bases and their caches, so idle ones made way
        for name, a in ad.items():
            assert a["total_page_ins"] >= 1 and a["total_bytes_in"] >= a["adapter_bytes"], (name, a)
            assert a["curr_refs"] == 0 and a["curr_resident"] in (0, 1), (name, a)
            assert a["curr_device_bytes"] == (65536 if a["curr_resident"] else 0), (name, a)
        assert sum(a["total_evictions"] for a in ad.values()) > 0, ad
        # evicting a base evicts its adapters
        ev = d.admin_call({"op": "evict", "id": "e", "model": "b0"})
        assert ev.get("ok"), ev
        ad = d.stats()["adapters"]
        on_b0 = [n for n, a in ad.items() if a["base"] == "b0"]
        assert len(on_b0) == 17 and not any(ad[n]["curr_resident"] for n in on_b0), ad
        # the adapters' requests ran in their bases' steps: fewer steps than requests
        steps = sum(st["models"][b]["total_steps"] for b, _ in BASES)
        assert steps < 53 * N, steps
        m = models_of(d)
        # its base's state, or partial while its base is resident and it is not
        a, b = m["a01"], m["b1"]
        assert a["base"] == "b1" and (a["state"] == b["state"] or
                                      (b["state"] == "resident" and a["state"] == "partial")), a
        assert (a["state"] == "resident") == (b["state"] == "resident" and a["adapter_resident"]), a
        c.close()
    finally:
        assert d.stop() == 0


def test_an_evicted_base_pages_back_in_with_its_adapters():
    some = ADAPTERS[:6]
    d = gsd.Daemon(entries(some), memory="4MiB")
    try:
        c = d.client(timeout=60)
        name, _, bpath, path = some[0]  # on b0
        assert c.call(gen(c, "w", name))["event"] == "done"
        assert models_of(d)[name]["state"] == "resident"
        a = d.stats()["adapters"][name]
        assert a["curr_resident"] == 1 and a["total_page_ins"] == 1 and a["total_evictions"] == 0, a
        ev = d.admin_call({"op": "evict", "id": "e", "model": "b0"})
        assert ev.get("ok") and ev["bytes_evicted"] > 0, ev
        m = models_of(d)
        assert m[name]["state"] == m["b0"]["state"] != "resident", m[name]
        a = d.stats()["adapters"][name]  # evicting the base evicted its adapter
        assert a["curr_resident"] == 0 and a["curr_device_bytes"] == 0, a
        assert a["total_evictions"] == 1 and not m[name]["adapter_resident"], a
        ans = d.admin_call({"op": "evict", "id": "e2", "model": name})  # it has no pages of its own
        assert ans["error"]["code"] == "bad_request" and "adapter of 'b0'" in ans["error"]["message"]
        before = d.stats()["models"]["b0"]["total_bytes_in"]
        ev = c.call(gen(c, "back", name))
        assert ev["event"] == "done" and ev["text"] == want(bpath, path), ev
        st = d.stats()
        assert st["models"]["b0"]["total_bytes_in"] > before  # paged in again
        assert st["adapters"][name]["total_page_ins"] == 2, st["adapters"][name]
        assert models_of(d)[name]["state"] == "resident"
        c.close()
    finally:
        assert d.stop() == 0


class PacedDaemon(gsd.Daemon):
    """With device.fault_injection, for the admin "stall" fault that paces a stream."""

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read()
        with open(self.config, "w") as f:
            f.write(text.replace("  threads: 1\n", "  threads: 1\n  fault_injection: true\n", 1))


def test_reload_adds_an_adapter_while_its_base_streams_and_a_bad_one_fails_alone():
    some = ADAPTERS[:3]
    new = ("n00", "b0", BASES[0][1], mklora(BASES[0][1], os.path.join(TMP, "n00.gguf"), 999))
    bad = os.path.join(TMP, "bad.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF" + b"\0" * 60)
    other = mklora(gsd.mkmodel(os.path.join(TMP, "wide.gguf"), SMALL.replace("--dim 64", "--dim 128")),
                   os.path.join(TMP, "wide-lora.gguf"), 7)
    d = PacedDaemon(entries(some), memory="4MiB")
    try:
        c = d.client(timeout=60)
        # every pass at least 5 ms: the stream is still running when the reload lands
        ans = d.admin_call({"op": "fault", "id": "p", "fault": "stall", "count": 100000, "delay_ms": 5})
        assert ans.get("ok"), ans
        s = gsd.Stream(d, "b0", 300, "long")
        gsd.until(lambda: len(s.ts) >= 5, 20)
        d.write_config(entries(some + [new, ("bad", "b0", None, bad), ("wide", "b1", None, other)]),
                       memory="4MiB")
        ans = d.admin_call({"op": "reload", "id": "r"})
        res = ans.get("result", ans)
        assert "error" not in ans and sorted(res["added"]) == ["bad", "n00", "wide"], ans
        assert res["reloaded"] == [], ans
        ev = c.call(gen(c, "n", "n00"))
        assert ev["event"] == "done" and ev["text"] == want(new[2], new[3]), ev
        assert d.stats()["adapters"]["n00"]["total_page_ins"] == 1  # paged in beside the stream
        assert s.done is None, "the stream ended before the reload's adapter answered"
        d.admin_call({"op": "fault", "id": "p", "fault": "off"})
        done = s.wait(60)
        assert done["usage"]["completion_tokens"] == 300 and len(s.ts) == 300, done
        assert d.logtext().count("loading model 'b0'") == 1, "the base was loaded again"
        m = models_of(d)
        for n in ("bad", "wide"):
            assert m[n]["state"] == "failed" and m[n]["error"], m[n]
        ev = c.call(gen(c, "x", "bad"))
        assert ev["event"] == "error" and ev["error"]["code"] == "unknown_model", ev
        assert "failed to load" in ev["error"]["message"], ev
        for name, _, bpath, path in some:  # the others serve
            ev = c.call(gen(c, "o" + name, name))
            assert ev["event"] == "done" and ev["text"] == want(bpath, path), ev
        # removing an adapter leaves its base alone
        d.write_config(entries(some[1:]), memory="4MiB")
        ans = d.admin_call({"op": "reload", "id": "r2"})
        res = ans.get("result", ans)
        assert "a00" in res["removed"] and res["reloaded"] == [], ans
        ev = c.call(gen(c, "gone", "a00"))
        assert ev["event"] == "error" and ev["error"]["code"] == "unknown_model", ev
        assert c.call(gen(c, "b", "b0"))["event"] == "done"
        c.close()
    finally:
        assert d.stop() == 0


def test_an_adapters_failed_copy_pages_it_in_again_and_its_request_answers():
    some = ADAPTERS[:3]
    d = PacedDaemon(entries(some), memory="4MiB")
    try:
        c = d.client(timeout=60)
        assert c.call(gen(c, "w", "b0"))["event"] == "done"  # resident: the next copy is a00's
        ans = d.admin_call({"op": "fault", "id": "f", "fault": "copy_fail", "count": 1})
        assert ans.get("ok"), ans
        name, _, bpath, path = some[0]
        ev = c.call(gen(c, "a", name))  # waits for its adapter: never a base-only answer
        assert ev["event"] == "done" and ev["text"] == want(bpath, path), ev
        st = d.stats()
        a = st["adapters"][name]
        assert a["total_page_ins"] == 2 and a["curr_resident"] == 1 and a["total_failed"] == 0, a
        assert st["models"]["b0"]["total_device_errors"] == 1, st["models"]["b0"]
        c.close()
    finally:
        assert d.stop() == 0


def test_the_prefix_cache_never_shares_kv_between_an_adapter_and_its_base():
    global PROMPT
    some = ADAPTERS[:6]  # a00 and a03 on b0
    d = gsd.Daemon(entries(some), memory="4MiB")
    saved, PROMPT = PROMPT, " ".join(["Once upon a time there was a little fox."] * 8)
    try:
        c = d.client(timeout=60)

        def hits():
            return d.stats()["models"]["b0"]["total_prefix_hit_tokens"]
        order = [("b0", None), ("a00", some[0][3]), ("a03", some[3][3]), ("a00", some[0][3])]
        seen = []
        for k, (name, lora) in enumerate(order):
            ev = c.call(gen(c, "p%d" % k, name))
            assert ev["event"] == "done" and ev["text"] == want(BASES[0][1], lora), (name, ev)
            seen.append(hits())
        # the base's cached prompt serves neither adapter, nor one adapter's the other; an
        # adapter's own does serve it again
        assert seen[0] == seen[1] == seen[2] < seen[3], seen
        c.close()
    finally:
        PROMPT = saved
        assert d.stop() == 0


def test_check_config_opens_each_adapter_against_its_base_naming_what_is_wrong():
    cfg = os.path.join(TMP, "check.yaml")
    other = mklora(gsd.mkmodel(os.path.join(TMP, "wide2.gguf"), SMALL.replace("--dim 64", "--dim 128")),
                   os.path.join(TMP, "wide2-lora.gguf"), 8)
    with open(cfg, "w") as f:
        f.write("models:\n  - name: b0\n    path: %s\n  - name: good\n    base: b0\n    adapter: %s\n"
                "  - name: wide\n    base: b0\n    adapter: %s\n" % (BASES[0][1], ADAPTERS[0][3], other))
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True,
                         timeout=gsd.scaled(60))
    assert out.returncode == 1, out
    assert "adapter 'good' of 'b0': 8 pairs on attn_q,attn_v,attn_output,ffn_up" in out.stderr, out.stderr
    bad = [l for l in out.stderr.splitlines() if "adapter 'wide'" in l]
    assert bad and "check.yaml:7: adapter 'wide': " in bad[0] and "another base" in bad[0], out.stderr
    assert "1 problem" in out.stderr, out.stderr


def test_v1_models_lists_each_adapter_with_its_base():
    port = gsd.free_port()
    d = gsd.Daemon(entries(ADAPTERS[:2]), memory="4MiB", listen="http: 127.0.0.1:%d" % port)
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/v1/models")
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        by = {m["id"]: m for m in body["data"]}
        assert set(by) == {"b0", "b1", "b2", "a00", "a01"}, sorted(by)
        assert by["a00"]["base"] == "b0" and by["a00"]["parent"] == "b0", by["a00"]
        assert by["a00"]["available"] is True and "base" not in by["b0"], by
        c.request("POST", "/v1/completions", json.dumps({"model": "a01", "prompt": PROMPT,
                                                         "max_tokens": N, "temperature": 0}))
        r = c.getresponse()
        out = json.loads(r.read())
        assert r.status == 200, out
        assert out["choices"][0]["text"] == want(ADAPTERS[1][2], ADAPTERS[1][3]), out
        c.request("GET", "/metrics")  # the stats report's adapter fields, one family each
        text = c.getresponse().read().decode()
        for line in ('gpuswapd_adapter_requests_total{adapter="a01",base="b1"} 1',
                     'gpuswapd_adapter_page_ins_total{adapter="a01",base="b1"} 1',
                     'gpuswapd_adapter_requests_total{adapter="a00",base="b0"} 0',
                     'gpuswapd_adapter_resident{adapter="a00",base="b0"} 0',
                     'gpuswapd_adapter_bytes_in_total{adapter="a01",base="b1"} %d' %
                     d.stats()["adapters"]["a01"]["adapter_bytes"]):
            assert line in text.splitlines(), (line, [l for l in text.splitlines() if "adapter_" in l])
        assert "# TYPE gpuswapd_adapter_evictions_total counter" in text
        c.close()
    finally:
        assert d.stop() == 0


def test_300_adapters_on_one_base_serve_and_an_adapters_gpu_quota_holds():
    """No fixed limit on adapters (there was one of 256): 300 entries on b0 (its adapter files
    shared); and gpu_quota on an adapter bounds its device copy: one beyond it is failed."""
    files = [a[3] for a in ADAPTERS if a[1] == "b0"]
    many = [("x%03d" % k, "b0", BASES[0][1], files[k % len(files)]) for k in range(300)]
    ents = entries(many) + [("q", None, "base: b0\nadapter: %s\ngpu_quota: 32KiB" % files[0])]
    d = gsd.Daemon(ents, memory="4MiB")
    try:
        c = d.client(timeout=60)
        for k in (0, 255, 256, 299):
            name, _, bpath, path = many[k]
            ev = c.call(gen(c, name, name))
            assert ev["event"] == "done" and ev["text"] == want(bpath, path), (name, ev)
        ad = d.stats()["adapters"]
        assert len(ad) == 301 and ad["x299"]["total_page_ins"] == 1, len(ad)
        m = models_of(d)
        assert m["q"]["state"] == "failed" and "gpu_quota" in m["q"]["error"], m["q"]
        ev = c.call(gen(c, "q", "q"))
        assert ev["event"] == "error" and "gpu_quota" in ev["error"]["message"], ev
        # a reload that raises it loads the adapter again; its base stays
        d.write_config(ents[:-1] + [("q", None, "base: b0\nadapter: %s\ngpu_quota: 64KiB" % files[0])],
                       memory="4MiB")
        ans = d.admin_call({"op": "reload", "id": "r"})
        assert "error" not in ans, ans
        ev = c.call(gen(c, "q2", "q"))
        assert ev["event"] == "done" and ev["text"] == want(BASES[0][1], files[0]), ev
        assert d.logtext().count("loading model 'b0'") == 1, "the base was loaded again"
        c.close()
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for t in (test_50_adapters_answer_as_generate_lora_in_their_bases_batches,
              test_an_evicted_base_pages_back_in_with_its_adapters,
              test_reload_adds_an_adapter_while_its_base_streams_and_a_bad_one_fails_alone,
              test_an_adapters_failed_copy_pages_it_in_again_and_its_request_answers,
              test_the_prefix_cache_never_shares_kv_between_an_adapter_and_its_base,
              test_check_config_opens_each_adapter_against_its_base_naming_what_is_wrong,
              test_v1_models_lists_each_adapter_with_its_base,
              test_300_adapters_on_one_base_serve_and_an_adapters_gpu_quota_holds):
        r.run(t)
    sys.exit(r.exit_code())
