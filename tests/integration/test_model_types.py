"""Each model's tensor types and bytes per parameter, the same on every surface: the socket's and the admin's models answer, the stats report, HTTP /v1/models, /metrics and `gpuswap models` (real daemon, sim backend, mkmodel's mixed-type Q4_K_M file)."""
import http.client
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-types-")
GPUSWAP = os.path.join(gsd.BUILD, "gpuswap")
SHAPE = "--dim 256 --layers 8 --heads 4 --kv-heads 2 --ff 512 --vocab 400 --seed 3"
# 8 layers x 7 matrices, token_embd and output, 17 F32 norms: Q4_K_M makes output
# and attn_v/ffn_down of layers 0, 3, 6, 7 Q6_K, the rest Q4_K
MODELS = [("mix", gsd.mkmodel(os.path.join(TMP, "mix.gguf"), "--type q4_k_m " + SHAPE), ""),
          ("half", gsd.mkmodel(os.path.join(TMP, "half.gguf"), "--type f16 " + SHAPE), "")]
WANT = {"mix": {"f32": 17, "q4_k": 49, "q6_k": 9}, "half": {"f32": 17, "f16": 58}}


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def file_bytes_per_param(path):
    """Weight bytes / parameters from the file's tensor table, read with the numpy
    reference's GGUF reader (tests/ref/ref.py), independent of the daemon."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ref"))
    import ref  # noqa: E402
    g = ref.GGUF(path)
    n = b = 0
    for info in g.tensors.values():
        e = 1
        for x in info["ne"]:
            e *= x
        blck, bsize = ref._TTYPES[info["type"]]
        n += e
        b += e // blck * bsize
    return b / n


def test_tensor_types_and_bytes_per_param_on_every_surface():
    port = gsd.free_port()
    d = gsd.Daemon(MODELS, memory="8MiB", listen="http: 127.0.0.1:%d" % port)
    try:
        c = d.client()
        ans = {m["name"]: m for m in c.call({"op": "models", "id": "m"})["models"]}
        c.close()
        adm = {m["name"]: m for m in d.admin_call({"op": "models", "id": "a"})["models"]}
        st = d.stats()["models"]
        status, body = get(port, "/v1/models")
        assert status == 200, body
        http_models = {m["id"]: m for m in json.loads(body)["data"]}
        status, one = get(port, "/v1/models/mix")
        assert status == 200, one
        one = json.loads(one)
        status, metrics = get(port, "/metrics")
        assert status == 200, metrics
        samples = {}
        for line in metrics.splitlines():
            if not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        for name, path, _ in MODELS:
            bpp = ans[name]["bytes_per_param"]
            want_bpp = file_bytes_per_param(path)
            assert abs(bpp - want_bpp) < 1e-9 * want_bpp, (name, bpp, want_bpp)
            for where, m in (("socket", ans[name]), ("admin", adm[name]), ("stats", st[name]),
                             ("http", http_models[name])):
                assert m["tensor_types"] == WANT[name], (where, name, m)
                assert m["bytes_per_param"] == bpp, (where, name, m)
            for t, n in WANT[name].items():
                assert samples['gpuswapd_tensors{model="%s",type="%s"}' % (name, t)] == n, (name, t)
            assert abs(samples['gpuswapd_bytes_per_param{model="%s"}' % name] - bpp) < 1e-8, name
        assert len([k for k in samples if k.startswith("gpuswapd_tensors{")]) == 5, metrics
        assert one["tensor_types"] == WANT["mix"] and one["bytes_per_param"] == ans["mix"]["bytes_per_param"]
        # Q4_K_M: 4.5 bits (Q4_K) with some 6.5625 (Q6_K) and F32 norms: about 4.9 bits a weight
        assert 0.55 < ans["mix"]["bytes_per_param"] < 0.7, ans["mix"]
        assert 2.0 <= ans["half"]["bytes_per_param"] < 2.05, ans["half"]

        out = subprocess.run([GPUSWAP, "--socket", d.sock, "models"], capture_output=True, text=True,
                             timeout=gsd.scaled(30))
        assert out.returncode == 0, out
        lines = out.stdout.splitlines()
        head = lines[0].split()
        assert head == ["MODEL", "STATE", "ARCH", "TYPE", "BITS", "PARAMS", "CONTEXT", "TENSORS"], lines
        rows = {l.split()[0]: l.split() for l in lines[1:]}
        assert rows["mix"][3] == "q4_k" and rows["half"][3] == "f16", rows
        assert float(rows["mix"][4]) == round(8 * ans["mix"]["bytes_per_param"], 2), rows
        for name in WANT:
            shown = dict(kv.split(":") for kv in rows[name][7].split(","))
            assert {k: int(v) for k, v in shown.items()} == WANT[name], (name, rows[name])
        # in the file's type order, as the answer lists them
        assert rows["mix"][7] == "f32:17,q4_k:49,q6_k:9", rows["mix"]
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_tensor_types_and_bytes_per_param_on_every_surface]:
        r.run(fn)
    sys.exit(r.exit_code())
