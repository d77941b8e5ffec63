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


class DeviceDaemon(gsd.Daemon):
    """gsd.Daemon with more keys in its device section."""

    def __init__(self, models, device, **kw):
        self.device_extra = device
        super().__init__(models, **kw)

    def write_config(self, *a, **kw):
        super().write_config(*a, **kw)
        text = open(self.config).read()
        more = "".join("  %s\n" % line for line in self.device_extra)
        with open(self.config, "w") as f:
            f.write(text.replace("  threads: 1\n", "  threads: 1\n" + more, 1))


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


LONG_SHAPE = "--type f16 --dim 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab 300 --ctx 4608"
LONG = gsd.mkmodel(os.path.join(TMP, "long.gguf"), LONG_SHAPE + " --seed 9")
N_LONG = 4096


def f32_bytes_for(n_tok, n_out, dim=64, ff=128, vocab=300):
    """fwd_scratch_need: activations of n_tok tokens, hidden state and logits of n_out rows."""
    return 4 * (6 * n_tok * dim + 2 * n_tok * ff + n_out * dim + n_out * vocab)


def test_a_4k_token_prompt_runs_in_chunks_with_bounded_scratch_and_unchanged_output():
    ids = [1] + [3 + (i * 37) % 290 for i in range(N_LONG - 1)]
    page = 64 * 1024
    want = subprocess.run([gsd.GPUSWAPD, "generate", "--model", LONG, "--prompt-ids", ",".join(map(str, ids)),
                           "-n", "4", "--temp", "0", "--json", "--quiet", "--threads", "1", "--ctx", "4608",
                           "--prefill-chunk", "0"],
                          capture_output=True, text=True, timeout=gsd.scaled(300), check=True)
    want = json.loads(want.stdout.strip().splitlines()[-1])
    for chunk in (512, 100):
        d = DeviceDaemon([("long", LONG, "max_context: 4608")], ["prefill_chunk: %d" % chunk], memory="8MiB")
        try:
            c = gsd.Client(d.sock, timeout=300)
            ans = c.call({"op": "generate", "id": "l", "model": "long", "tokens": ids, "max_tokens": 4,
                          "temperature": 0})
            c.close()
            assert ans.get("event") == "done", ans
            assert ans["usage"]["prompt_tokens"] == N_LONG, ans
            # the same tokens as one unchunked pass of `gpuswapd generate`
            assert ans["text"] == want["text"], (chunk, ans["text"], want["text"])
            pool = d.stats()["pool"]
            st = d.stats()["models"]["long"]
            bound = f32_bytes_for(chunk, 1)
            # scratch is sized by the chunk, not by the 4k prompt
            assert pool["curr_scratch_bytes"] == bound, (pool, bound)
            assert pool["curr_scratch_bytes"] * 6 < f32_bytes_for(N_LONG, 1), pool  # 8x fewer tokens
            # peak device bytes: weights + the whole KV cache + scratch, nothing that grows with the prompt
            kv = -(-(N_LONG + 4) * st["kv_bytes_per_token"] // 2 // page) * page * 2
            assert pool["peak_device_bytes"] <= st["weight_bytes"] + kv + bound, (pool, st)
            assert pool["peak_device_bytes"] >= st["weight_bytes"] + kv, (pool, st)
            # the scratch's pages come off the pool, so pool + scratch stay within the device's 8 MiB
            reserved = -(-pool["curr_scratch_bytes"] // page) * page
            assert pool["curr_scratch_reserved_bytes"] == reserved, (pool, reserved)
            assert pool["curr_pool_pages"] * page + reserved + pool["curr_budget_cut_bytes"] == 8 << 20, pool
            assert pool["peak_device_bytes"] <= 8 << 20, pool
            print("    chunk %d: scratch %d B, peak device %d B (weights %d, KV %d; unchunked scratch "
                  "would be %d B)" % (chunk, pool["curr_scratch_bytes"], pool["peak_device_bytes"],
                                      st["weight_bytes"], kv, f32_bytes_for(N_LONG, N_LONG)))
        finally:
            assert d.stop() == 0


GROW = gsd.mkmodel(os.path.join(TMP, "grow.gguf"),
                   "--type f16 --dim 64 --layers 2 --heads 2 --kv-heads 2 --ff 128 --vocab 300 --ctx 2048 --seed 1")
N_GROW = 1200  # greedy on PROMPT meets no end-of-sequence before this (seed 1)


def test_kv_caches_grow_page_by_page_and_a_short_pool_parks_and_recomputes_instead_of_failing():
    want = gsd.generate_cli(GROW, PROMPT, N_GROW)
    assert len(want["ids"]) == N_GROW, len(want["ids"])
    # 6 sequences of 1200+ positions (512 B each at F16, 0.62 MiB a cache) in a 3 MiB pool:
    # all are admitted on their prompt's pages, some are parked when the pool runs short
    d = gsd.Daemon([("g", GROW, "")], memory="3MiB")
    try:
        clients = [d.client() for _ in range(6)]
        for i, c in enumerate(clients):
            c.send({"op": "generate", "id": "r%d" % i, "model": "g", "prompt": PROMPT, "max_tokens": N_GROW,
                    "temperature": 0})
        peak_running, seen = 0, 0
        import time
        deadline = time.time() + gsd.scaled(120)
        while seen == 0 and time.time() < deadline:
            st = d.stats()["models"]["g"]
            peak_running = max(peak_running, st["curr_kv_seqs"])
            seen = st["total_kv_recomputes"]
            time.sleep(0.01)
        for i, c in enumerate(clients):
            ans = c.final("r%d" % i)[0]
            c.close()
            assert ans.get("event") == "done", ans
            assert ans["text"] == want["text"], (i, ans["text"][:80], want["text"][:80])
        st = d.stats()["models"]["g"]
        assert st["total_kv_recomputes"] >= 1, st
        assert st["curr_kv_seqs"] == 0 and st["curr_kv_bytes"] == 0, st
        assert st["total_failed"] == 0, st
        print("    %d sequences' caches given back and recomputed; up to %d caches at once"
              % (st["total_kv_recomputes"], peak_running))
    finally:
        assert d.stop() == 0


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [v for k, v in sorted(globals().items()) if k.startswith("test_")]:
        r.run(fn)
    sys.exit(r.exit_code())
