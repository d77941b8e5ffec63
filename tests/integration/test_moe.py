"""Mixtures of experts (issue 45): Mixtral-style llama, qwen2moe and qwen3moe files agree with
llama.cpp's logits (tests/data/arch/llama-cpp-<case>.json, recorded from the mkmodel arguments they
carry; a case whose file is absent is skipped, naming it), page in on the sim backend beside a dense
model in one pool and answer exactly as the one-shot engine does, and a file declaring gating the
engine does not compute is refused by name."""
import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-moe-")
DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")

# The recorded cases (their mkmodel arguments are in each JSON, and /work/moe-cases.txt listed
# them for the recording): each family in F32, F16, Q8_0 and Q4_K_M, and qwen3moe top 4 of 8.
CASES = ["%s-%s" % (f, t) for f in ("mixtral", "qwen2moe", "qwen3moe")
         for t in ("f32", "f16", "q80", "q4km")] + ["qwen3moe-top4-f32"]

# rms(engine - llama.cpp) / std(llama.cpp): the dense families' bounds (tests/data/README.md):
# 1% where llama.cpp computes in float (F32, F16 weights), 6% where both quantize activations
RMS_BOUND = {"f32": 0.01, "f16": 0.01, "q80": 0.06, "q4km": 0.06}
ARGMAX_MARGIN = 0.1   # the argmax must agree where llama.cpp's top-1/top-2 margin is above this
GREEDY_MARGIN = 0.02  # greedy ids must agree up to the first step whose margin is below this

SMALL = "--dim 64 --layers 4 --heads 4 --kv-heads 2 --vocab 512"
SERVED = [
    ("mixtral", "--arch llama --type q8_0 %s --ff 128 --experts 8 --experts-used 2 --seed 71" % SMALL),
    ("qwen2moe", "--arch qwen2moe --type f16 %s --ff 256 --experts 8 --experts-used 2 --expert-ff 64 "
                 "--shared-ff 128 --seed 72" % SMALL),
    ("qwen3moe", "--arch qwen3moe --type bf16 %s --ff 256 --experts 8 --experts-used 4 --expert-ff 64 "
                 "--seed 73" % SMALL),
    ("dense", "--arch qwen3 --type f16 %s --ff 256 --seed 74" % SMALL),
]


def test_moe_files_agree_with_llama_cpp_after_200_tokens():
    import numpy as np
    ran = 0
    for name in CASES:
        path = os.path.join(DATA, "arch", "llama-cpp-%s.json" % name)
        if not os.path.exists(path):
            print("  skip: reference data missing: %s (llama.cpp's logits for the %s case)"
                  % (path, name), flush=True)
            continue
        ref = json.load(open(path))
        model = gsd.mkmodel(os.path.join(TMP, "o-%s.gguf" % name), ref["mkmodel"])
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
        assert sha == ref["model_sha256"], "%s: mkmodel now writes another file (%s); re-record" % (name, sha)
        dump = os.path.join(TMP, "o-%s.logits" % name)
        n_greedy = len(ref.get("greedy", []))
        out = subprocess.run([gsd.GPUSWAPD, "generate", "--model", model, "--prompt-ids",
                              ",".join(str(i) for i in ref["prompt_ids"]), "-n", str(max(1, n_greedy)),
                              "--temp", "0", "--ignore-eos", "--json", "--quiet", "--dump-logits", dump,
                              "--ctx", str(ref.get("n_ctx", 512))],
                             check=True, capture_output=True, text=True, timeout=gsd.scaled(180))
        want = np.array(ref["logits"])
        got = np.array([float(x) for x in open(dump).readline().split()])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        rel = float(np.sqrt(np.mean((got - want) ** 2)) / np.std(want))
        top = np.sort(want)[-2:]
        print("  %s: rms(engine - llama.cpp) = %.4f%% of their std" % (name, 100 * rel), flush=True)
        assert rel <= RMS_BOUND[name.rsplit("-", 1)[1]], (name, rel)
        if top[1] - top[0] > ARGMAX_MARGIN:
            assert int(np.argmax(got)) == int(np.argmax(want)), name
        ids = json.loads(out.stdout.strip().splitlines()[-1])["ids"]
        # a near tie: either id is llama.cpp's answer within its rounding. The quantized files' logits
        # differ from llama.cpp's by 1-3% of their std (0.02-0.06 here), as the dense quantized files'
        # do (it quantizes activations its own way): there a margin within twice that rms is a tie too.
        # llama.cpp parts from itself there as well: c392e50 and 80fb11a differ at step 8 of
        # qwen2moe-q4km at a margin of 0.027 (tests/data/README.md)
        tie = max(GREEDY_MARGIN, 2 * float(np.sqrt(np.mean((got - want) ** 2))))
        same = 0
        for k, step in enumerate(ref.get("greedy", [])):
            if step["margin"] < tie:
                break
            assert ids[k] == step["id"], (name, k, ids[k], step)
            same += 1
        if ref.get("greedy"):
            print("  %s: greedy ids equal for %d of %d steps (to the first margin < %.3f)" % (
                name, same, len(ref["greedy"]), tie), flush=True)
        ran += 1
    print("  %d of %d llama.cpp cases compared" % (ran, len(CASES)), flush=True)


def test_moe_models_share_a_pool_with_a_dense_one_and_answer_like_generate():
    models = [(name, gsd.mkmodel(os.path.join(TMP, "s-%s.gguf" % name), args), "")
              for name, args in SERVED]
    d = gsd.Daemon(models, memory="3MiB")  # not all at once: switches page in and evict
    try:
        c = d.client()
        for rnd in range(2):
            for name, path, _ in models:
                w = gsd.generate_cli(path, "Once upon a time", 12)
                ev = c.call({"op": "generate", "id": "%s-%d" % (name, rnd), "model": name,
                             "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0})
                assert ev["event"] == "done" and ev["text"] == w["text"], (name, ev, w["text"])
        ans = {m["name"]: m for m in c.call({"op": "models", "id": "m"})["models"]}
        c.close()
        assert ans["qwen2moe"]["arch"] == "qwen2moe" and ans["qwen3moe"]["arch"] == "qwen3moe", ans
        st = d.stats()["models"]
        assert all(st[n]["total_page_ins"] >= 2 for n in ans), st
    finally:
        assert d.stop() == 0


def test_check_config_refuses_gating_the_engine_does_not_compute():
    small = "--dim 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --ff 256"
    refused = [
        ("sigmoid", "--arch qwen3moe --experts 8 --experts-used 2 "
                    "--extra-u32 qwen3moe.expert_gating_func=2",
         "'qwen3moe.expert_gating_func' = 2 (sigmoid) is not implemented"),
        ("groups", "--arch qwen3moe --experts 8 --experts-used 2 "
                   "--extra-u32 qwen3moe.expert_group_count=4",
         "metadata key 'qwen3moe.expert_group_count' is not understood"),
    ]
    lines = ["listen:", "  socket: %s/s.sock" % TMP, "device:", "  backend: sim", "  memory: 4MiB",
             "models:"]
    for name, args, _ in refused + [("ok", "--arch qwen2moe --experts 8 --experts-used 2", "")]:
        path = gsd.mkmodel(os.path.join(TMP, "r-%s.gguf" % name), small + " " + args)
        lines += ["  - name: %s" % name, "    path: %s" % path]
    cfg = os.path.join(TMP, "refuse.yaml")
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True,
                         timeout=gsd.scaled(60))
    assert out.returncode == 1, out
    for name, _, want in refused:
        got = [l for l in out.stderr.splitlines() if "model '%s'" % name in l]
        assert got and want in got[0], (name, want, out.stderr)
    assert any("model 'ok': qwen2moe" in l for l in out.stderr.splitlines()), out.stderr


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_moe_files_agree_with_llama_cpp_after_200_tokens,
               test_moe_models_share_a_pool_with_a_dense_one_and_answer_like_generate,
               test_check_config_refuses_gating_the_engine_does_not_compute]:
        r.run(fn)
    sys.exit(r.exit_code())
