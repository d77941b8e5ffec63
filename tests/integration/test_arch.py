"""Architectures in the daemon (issue 17): files whose tensors or keys change the math in ways the
engine does not implement are refused at load naming them; qwen3, gemma2, gemma3, phi3 and Llama 3 /
linear-RoPE llama models page in on the sim backend and answer exactly as the one-shot engine does."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-arch-")
SHAPE = "--dim 256 --layers 8 --heads 4 --kv-heads 2 --ff 512 --vocab 400 --ctx 512"

# (name, mkmodel arguments, what the refusal must name)
REFUSED = [
    ("mamba", "--arch-name mamba", "architecture 'mamba' is not supported"),
    ("longrope", "--rope-scaling longrope:4",
     "'llama.rope.scaling.type' = 'longrope' is not implemented"),
    ("gemma3-yarn", "--arch gemma3 --window 4 --rope-scaling yarn:4",
     "YaRN RoPE scaling of a gemma3 model is not implemented"),
    ("bogus-rope", "--rope-scaling bogus", "'llama.rope.scaling.type' = 'bogus' is unknown"),
    ("moe", "--extra-tensor blk.0.ffn_gate_exps.weight",
     "tensor 'blk.0.ffn_gate_exps.weight' is not used"),
    ("experts", "--extra-u32 llama.expert_count=8", "'llama.expert_count' = 8"),
    ("swa", "--arch qwen2 --extra-u32 qwen2.attention.sliding_window=16",
     "metadata key 'qwen2.attention.sliding_window' is not understood"),
]

SERVED = [
    ("qwen3", "--arch qwen3 --type f16 --head-dim 32 --seed 4"),
    ("llama3", "--arch llama --type q8_0 --rope-freqs --rope-base 500000 --seed 5"),
    ("linear", "--arch llama --type bf16 --rope-scaling linear:4 --tied --seed 6"),
    ("yarn", "--arch llama --type f16 --rope-scaling yarn:4 --rope-orig-ctx 16 --seed 10"),
    ("gemma2", "--arch gemma2 --type q8_0 --softcap 5,10 --window 4 --seed 7"),
    ("gemma3", "--arch gemma3 --type f16 --window 4 --rope-base 1000000 --seed 8"),
    ("phi3", "--arch phi3 --type q4_k_m --window 4 --seed 9"),
]


def test_check_config_refuses_unimplemented_architectures_tensors_and_keys_by_name():
    small = "--dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 300"
    lines = ["listen:", "  socket: %s/s.sock" % TMP, "device:", "  backend: sim", "  memory: 4MiB",
             "models:"]
    for name, args, _ in REFUSED + [("ok", "--arch qwen3", "")]:
        path = gsd.mkmodel(os.path.join(TMP, "r-%s.gguf" % name), small + " " + args)
        lines += ["  - name: %s" % name, "    path: %s" % path]
    cfg = os.path.join(TMP, "refuse.yaml")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True,
                         timeout=gsd.scaled(60))
    assert out.returncode == 1, out
    for name, _, want in REFUSED:
        got = [l for l in out.stderr.splitlines() if "model '%s'" % name in l]
        assert got and want in got[0], (name, want, out.stderr)
    assert any("model 'ok': qwen3" in l for l in out.stderr.splitlines()), out.stderr
    # the daemon logs the refusal, serves the others, and answers the refused one with the reason
    d = gsd.Daemon([("ok", os.path.join(TMP, "r-ok.gguf"), ""),
                    ("moe", os.path.join(TMP, "r-moe.gguf"), "")], tmp=gsd.tmpdir("gsd-arch-d-"))
    try:
        assert "tensor 'blk.0.ffn_gate_exps.weight' is not used" in d.logtext(), d.logtext()
        c = d.client()
        states = {m["name"]: m["state"] for m in c.call({"op": "models", "id": "m"})["models"]}
        assert states == {"ok": "host", "moe": "failed"}, states
        ev = c.call({"op": "generate", "id": "g", "model": "moe", "prompt": "x", "max_tokens": 2})
        assert ev["event"] == "error" and "ffn_gate_exps" in ev["error"]["message"], ev
        ev = c.call({"op": "generate", "id": "h", "model": "ok", "prompt": "x", "max_tokens": 2})
        assert ev["event"] == "done", ev
        c.close()
    finally:
        assert d.stop() == 0


def test_qwen3_gemma_and_llama_rope_variants_page_in_and_answer_like_generate():
    models = [(name, gsd.mkmodel(os.path.join(TMP, "s-%s.gguf" % name), SHAPE + " " + args), "")
              for name, args in SERVED]
    d = gsd.Daemon(models, memory="4MiB")  # holds one at a time: every switch pages in
    try:
        c = d.client()
        for rnd in range(2):
            for name, path, _ in models:
                w = gsd.generate_cli(path, "Once upon a time", 8)
                ev = c.call({"op": "generate", "id": "%s-%d" % (name, rnd), "model": name,
                             "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
                assert ev["event"] == "done" and ev["text"] == w["text"], (name, ev, w["text"])
        ans = {m["name"]: m for m in c.call({"op": "models", "id": "m"})["models"]}
        c.close()
        assert ans["qwen3"]["arch"] == "qwen3", ans["qwen3"]
        st = d.stats()["models"]
        assert all(st[n]["total_page_ins"] >= 2 for n in ans), st
    finally:
        assert d.stop() == 0


def test_phi3_rope_factors_follow_each_models_max_context_as_generate_ctx_does():
    """One Phi-3 LongRoPE file (original context 64) served twice: max_context 512 runs the long
    factors, max_context 60 the short ones, each answering as `generate --ctx` with that context."""
    path = gsd.mkmodel(os.path.join(TMP, "phi3-lr.gguf"), SHAPE + " --arch phi3 --type q8_0 --window 8 "
                       "--rope-factors --rope-attn-factor 1.19 --seed 12")
    want = {}
    for ctx in (512, 60):
        out = subprocess.run([gsd.GPUSWAPD, "generate", "--model", path, "--prompt", "Once upon a time",
                              "-n", "8", "--temp", "0", "--json", "--quiet", "--ctx", str(ctx)],
                             capture_output=True, text=True, timeout=gsd.scaled(60))
        assert out.returncode == 0, out
        want[ctx] = json.loads(out.stdout.strip().splitlines()[-1])["text"]
    assert want[512] != want[60], want  # the factors change the answer, so the test tells them apart
    d = gsd.Daemon([("long", path, "max_context: 512"), ("short", path, "max_context: 60\ndefaults:\n  max_tokens: 16")],
                   memory="4MiB")
    try:
        c = d.client()
        for name, ctx in (("long", 512), ("short", 60)):
            ev = c.call({"op": "generate", "id": name, "model": name, "prompt": "Once upon a time",
                         "max_tokens": 8, "temperature": 0})
            assert ev["event"] == "done" and ev["text"] == want[ctx], (name, ev, want[ctx])
        # a reload that moves max_context across the original context loads the model again
        # (requests under way finish on the old copy), which then takes the factors for it
        d.write_config([("long", path, "max_context: 60\ndefaults:\n  max_tokens: 16"),
                        ("short", path, "max_context: 60\ndefaults:\n  max_tokens: 16")],
                       memory="4MiB")
        ans = d.admin_call({"op": "reload", "id": "r"})
        assert ans["ok"] and ans["reloaded"] == ["long"], ans
        ev = c.call({"op": "generate", "id": "again", "model": "long", "prompt": "Once upon a time",
                     "max_tokens": 8, "temperature": 0})
        assert ev["event"] == "done" and ev["text"] == want[60], (ev, want[60])
        c.close()
    finally:
        assert d.stop() == 0


DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")
ORACLE_RMS = 0.01  # rms(engine - llama.cpp) / std(llama.cpp) per file


def test_llama_rope_freqs_yarn_qwen2_gemma2_and_phi3_agree_with_llama_cpp_after_200_tokens():
    import hashlib
    import numpy as np
    names = ["llama-rope-freqs", "qwen2", "gemma2", "phi3", "llama-yarn", "qwen2-yarn",
             "phi3-long-factors", "phi3-short-factors"]
    for name in names:
        ref = json.load(open(os.path.join(DATA, "arch", "llama-cpp-%s.json" % name)))  # vendored
        model = gsd.mkmodel(os.path.join(TMP, "o-%s.gguf" % name), ref["mkmodel"])
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
        assert sha == ref["model_sha256"], "%s: mkmodel now writes another file (%s); re-record" % (name, sha)
        dump = os.path.join(TMP, "o-%s.logits" % name)
        subprocess.run([gsd.GPUSWAPD, "generate", "--model", model, "--prompt-ids",
                        ",".join(str(i) for i in ref["prompt_ids"]), "-n", "1", "--temp", "0", "--json",
                        "--quiet", "--dump-logits", dump, "--ctx", str(ref.get("n_ctx", 512))],
                       check=True, capture_output=True,
                       timeout=gsd.scaled(120))
        want = np.array(ref["logits"])
        got = np.array([float(x) for x in open(dump).readline().split()])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        rel = float(np.sqrt(np.mean((got - want) ** 2)) / np.std(want))
        print("  %s: rms(engine - llama.cpp) = %.4f%% of their std" % (name, 100 * rel))
        assert rel <= ORACLE_RMS, (name, rel)
        assert int(np.argmax(got)) == int(np.argmax(want)), name


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_check_config_refuses_unimplemented_architectures_tensors_and_keys_by_name,
               test_qwen3_gemma_and_llama_rope_variants_page_in_and_answer_like_generate,
               test_phi3_rope_factors_follow_each_models_max_context_as_generate_ctx_does,
               test_llama_rope_freqs_yarn_qwen2_gemma2_and_phi3_agree_with_llama_cpp_after_200_tokens]:
        r.run(fn)
    sys.exit(r.exit_code())
