"""KV cache and prefill on the real daemon (sim backend): F16 KV by default with half the bytes per token of
kv_type f32, each model's generations equal to `gpuswapd generate` with the same KV type."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-kv-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400"
MODEL = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE + " --seed 5")
PROMPT = "Once upon a time"


def generate_cli(kv_type, n):
    out = subprocess.run([gsd.GPUSWAPD, "generate", "--model", MODEL, "--prompt", PROMPT, "-n", str(n),
                          "--temp", "0", "--json", "--quiet", "--threads", "1", "--kv-type", kv_type],
                         capture_output=True, text=True, timeout=gsd.scaled(120), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gen(d, model, n, rid="g", prompt=PROMPT):
    c = d.client()
    try:
        return c.call({"op": "generate", "id": rid, "model": model, "prompt": prompt, "max_tokens": n,
                       "temperature": 0})
    finally:
        c.close()


def test_f16_kv_is_the_default_and_takes_half_the_bytes_per_token_of_f32():
    n = 24
    d = gsd.Daemon([("h", MODEL, ""), ("s", MODEL, "kv_type: f32")], memory="4MiB")
    try:
        st = d.stats()["models"]
        assert st["h"]["kv_type"] == "f16" and st["s"]["kv_type"] == "f32", st
        # 4 layers x 2 KV heads x 32 dims, k and v: 1 KiB per token at F32, 512 B at F16
        assert st["s"]["kv_bytes_per_token"] == 2 * 4 * 64 * 4, st["s"]
        assert st["h"]["kv_bytes_per_token"] * 2 == st["s"]["kv_bytes_per_token"], st
        models = {m["name"]: m for m in d.admin_call({"op": "models", "id": "m"})["models"]}
        assert models["h"]["kv_bytes_per_token"] == st["h"]["kv_bytes_per_token"], models
        for name, kv in (("h", "f16"), ("s", "f32")):
            ans = gen(d, name, n, rid=name)
            assert ans.get("event") == "done", ans
            want = generate_cli(kv, n)
            assert ans["text"] == want["text"], (name, ans["text"], want["text"])
        st = d.stats()["models"]
        assert st["h"]["curr_kv_bytes"] == 0 and st["s"]["curr_kv_bytes"] == 0, st
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [v for k, v in sorted(globals().items()) if k.startswith("test_")]:
        r.run(fn)
    sys.exit(r.exit_code())
