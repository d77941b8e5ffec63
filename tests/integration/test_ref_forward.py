#!/usr/bin/python3
"""test_ref_forward: the engine's logits and greedy ids match the float64 reference (tests/ref/ref.py).

For every weight type and architecture (plus tied-embedding and GQA/MQA/MHA
shapes; the block types on both the exact and the fast path) this generates a small random model with $BUILD/mkmodel, runs
`$BUILD/gpuswapd generate ... --temp 0 --json --dump-logits FILE`, and
compares each step's logits with the reference forward pass over
prompt + generated ids. Run from the repository root; GPUSWAPD_BUILD names
the build directory (default "build"). Prints "ok CASE" or
"FAIL CASE: reason" per case; exits 1 if any case failed.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import ref  # noqa: E402

BUILD = os.environ.get("GPUSWAPD_BUILD", "build")
MKMODEL = os.path.join(BUILD, "mkmodel")
GPUSWAPD = os.path.join(BUILD, "gpuswapd")

PROMPT = [1, 5, 9, 13, 200]
# 40 positions, so slow RoPE pairs (Llama 3 factors, linear scaling) turn far
LONG_PROMPT = [1] + [(7 * i + 3) % 290 + 5 for i in range(39)]
N_GEN = 6

# Max |engine - ref| allowed per step, relative to max(1, max |ref logit|).
# On its exact path (F32 activations, the default for F32/F16/BF16/Q8_0 and
# `generate --exact` for the other block types) the engine computes on the
# stored weight values exactly with F32 arithmetic, so every type gets the
# same bound as F32: the reference dequantizes the very same stored values,
# and what is left is F32 rounding (~1e-6 relative at these sizes).
TOL = 1e-4

# The fast path of the block types (activations quantized to 8 bits, as
# llama.cpp does) is held to the bar llama.cpp's own logits are held to
# (tests/data/README.md): per step, rms(engine - ref) <= 6% of the std of
# the reference logits, and the same argmax where its margin exceeds 0.1.
FAST_RMS = 0.06
FAST_MARGIN = 0.1

BLOCK_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
               "iq4_nl", "iq4_xs", "q4_k_m")

# Greedy ids are only compared where the ref top-1/top-2 margin exceeds this.
MARGIN = 1e-3

SMALL = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
         "--ff", "128", "--vocab", "320"]

# The K types and IQ4_XS need rows of whole 256-value blocks.
WIDE = ["--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
        "--ff", "512", "--vocab", "320"]

# (case name, path, mkmodel arguments); path "exact" or "fast" (see above)
CASES = []
for _arch in ("llama", "qwen2"):
    for _t in ("f32", "f16", "bf16", "q8_0"):
        CASES.append(("%s-%s" % (_arch, _t), "exact",
                      ["--arch", _arch, "--type", _t, "--seed", "7"] + SMALL))
    for _t in BLOCK_TYPES:
        _shape = SMALL if _t in ("q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl") else WIDE
        for _path in ("exact", "fast"):
            CASES.append(("%s-%s-%s" % (_arch, _t, _path), _path,
                          ["--arch", _arch, "--type", _t, "--seed", "9"] + _shape))
# Architectures and RoPE variants beyond plain llama/qwen2 (issue 17): qwen3
# (per-head q/k RMSNorm) in every exact type, tied and GQA, and with heads
# wider than dim/heads; llama with Llama 3 rope_freqs, linear RoPE scaling
# and attention.key_length. Optional 4th element: the prompt.
for _t in ("f32", "f16", "bf16", "q8_0"):
    CASES.append(("qwen3-%s" % _t, "exact", ["--arch", "qwen3", "--type", _t, "--seed", "21"] + SMALL))
for _t in ("q4_k", "q6_k"):
    for _path in ("exact", "fast"):
        CASES.append(("qwen3-%s-%s" % (_t, _path), _path,
                      ["--arch", "qwen3", "--type", _t, "--seed", "22"] + WIDE))
# gemma2 with soft-caps and a window small enough that the 40-token prompt
# runs through both (5 and 10, window 16), in every exact type, GQA, wide heads
for _t in ("f32", "f16", "bf16", "q8_0"):
    CASES.append(("gemma2-%s" % _t, "exact",
                  ["--arch", "gemma2", "--type", _t, "--softcap", "5,10", "--window", "16",
                   "--seed", "31"] + SMALL, LONG_PROMPT))
for _t in ("q4_k", "q5_k"):
    for _path in ("exact", "fast"):
        CASES.append(("gemma2-%s-%s" % (_t, _path), _path,
                      ["--arch", "gemma2", "--type", _t, "--softcap", "5,10", "--window", "16",
                       "--seed", "32"] + WIDE, LONG_PROMPT))
CASES += [
    ("gemma2-f32-gqa4-hd32-3layers", "exact",
     ["--arch", "gemma2", "--type", "f32", "--dim", "64", "--heads", "8", "--kv-heads", "2",
      "--head-dim", "32", "--layers", "3", "--ff", "128", "--vocab", "320", "--softcap", "5,10",
      "--window", "8", "--eps", "1e-6", "--seed", "33"], LONG_PROMPT),
    ("gemma2-f16-default-caps", "exact",
     ["--arch", "gemma2", "--type", "f16", "--seed", "34"] + SMALL),
]
# Mixtures of experts (issue 45): Mixtral-style llama, qwen2moe (shared expert,
# weights not renormalised) and qwen3moe (q/k norms), in every exact type and
# Q4_K_M (its _exps in two types) on both paths; 8 experts, top 2 (qwen3moe
# also top 4), over the 40-token prompt so every expert is taken
_MOE = {"llama": ["--ff", "128", "--experts", "8", "--experts-used", "2"],
        "qwen2moe": ["--ff", "256", "--experts", "8", "--experts-used", "2", "--expert-ff", "64",
                     "--shared-ff", "128"],
        "qwen3moe": ["--ff", "256", "--experts", "8", "--experts-used", "2", "--expert-ff", "128"]}
_MOE_WIDE = {"llama": ["--ff", "256", "--experts", "8", "--experts-used", "2"],
             "qwen2moe": ["--ff", "512", "--experts", "8", "--experts-used", "2", "--expert-ff",
                          "256", "--shared-ff", "512"],
             "qwen3moe": ["--ff", "512", "--experts", "8", "--experts-used", "2", "--expert-ff",
                          "256"]}
for _arch, _extra in _MOE.items():
    _name = "mixtral" if _arch == "llama" else _arch
    for _t in ("f32", "f16", "bf16", "q8_0"):
        CASES.append(("%s-%s" % (_name, _t), "exact",
                      ["--arch", _arch, "--type", _t, "--seed", "51"] + SMALL[:-4] + _extra +
                      ["--vocab", "320"], LONG_PROMPT))
    for _path in ("exact", "fast"):
        CASES.append(("%s-q4_k_m-%s" % (_name, _path), _path,
                      ["--arch", _arch, "--type", "q4_k_m", "--seed", "52"] + WIDE[:-4] +
                      _MOE_WIDE[_arch] + ["--vocab", "320"], LONG_PROMPT))
CASES.append(("qwen3moe-top4-f32", "exact",
              ["--arch", "qwen3moe", "--type", "f32", "--seed", "53"] + SMALL[:-4] +
              ["--ff", "256", "--experts", "8", "--experts-used", "4", "--expert-ff", "64",
               "--vocab", "320"], LONG_PROMPT))
# gemma3: q/k norms, 5 of 6 layers sliding (window 8) with their own RoPE
# base, the global ones at base 1e6 scaled linearly by 8 (as Gemma 3 4B+)
_G3 = ["--arch", "gemma3", "--window", "8", "--layers", "7", "--rope-base", "1000000",
       "--rope-scaling", "linear:8"]
for _t in ("f32", "f16", "bf16", "q8_0"):
    CASES.append(("gemma3-%s" % _t, "exact", _G3 + ["--type", _t, "--seed", "41", "--dim", "64",
                  "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ff", "128",
                  "--vocab", "320"], LONG_PROMPT))
for _path in ("exact", "fast"):
    CASES.append(("gemma3-q6_k-%s" % _path, _path,
                  _G3 + ["--type", "q6_k", "--seed", "42"] + WIDE[:2] + WIDE[4:], LONG_PROMPT))
CASES.append(("gemma3-f32-mqa-unscaled", "exact",
              ["--arch", "gemma3", "--window", "4", "--layers", "6", "--type", "f32", "--dim", "64",
               "--heads", "4", "--kv-heads", "1", "--ff", "128", "--vocab", "320", "--seed", "43"],
              LONG_PROMPT))
# phi3: fused qkv and gate/up (row views of one tensor in every type), every
# layer sliding (window 8), Phi-3 128k-like short/long RoPE factors (original
# context 64): the long ones at the default context of 256, the short ones at 64
for _t in ("f32", "f16", "bf16", "q8_0"):
    CASES.append(("phi3-%s" % _t, "exact", ["--arch", "phi3", "--type", _t, "--window", "8",
                  "--rope-factors", "--seed", "51"] + SMALL, LONG_PROMPT))
CASES.append(("phi3-f32-short-factors-ctx64", "exact",
              ["--arch", "phi3", "--type", "f32", "--window", "8", "--rope-factors",
               "--seed", "51"] + SMALL, LONG_PROMPT, 64))
for _t in ("q4_k_m", "iq4_xs"):
    for _path in ("exact", "fast"):
        CASES.append(("phi3-%s-%s" % (_t, _path), _path,
                      ["--arch", "phi3", "--type", _t, "--window", "16", "--seed", "52"] + WIDE,
                      LONG_PROMPT))
# Phi-3.5 / 128k files: LongRoPE's attention factor (cos and sin scaled)
CASES.append(("phi3-f16-rope-attn-factor", "exact",
              ["--arch", "phi3", "--type", "f16", "--window", "8", "--rope-factors",
               "--rope-attn-factor", "1.19", "--seed", "54"] + SMALL, LONG_PROMPT))
CASES.append(("phi3-q8_0-mha-no-window", "exact",
              ["--arch", "phi3", "--type", "q8_0", "--window", "0", "--heads", "4", "--kv-heads", "4",
               "--dim", "64", "--layers", "3", "--ff", "96", "--vocab", "320", "--seed", "53"]))
CASES += [
    ("qwen3-f16-tied-gqa4-hd32", "exact",
     ["--arch", "qwen3", "--type", "f16", "--tied", "--dim", "64", "--heads", "8", "--kv-heads", "2",
      "--head-dim", "32", "--layers", "3", "--ff", "128", "--vocab", "320", "--rope-base", "1000000",
      "--eps", "1e-6", "--seed", "23"], LONG_PROMPT),
    ("llama-f32-rope-freqs", "exact",
     ["--arch", "llama", "--type", "f32", "--rope-freqs", "--seed", "24"] + SMALL, LONG_PROMPT),
    ("llama-q8_0-rope-freqs-gqa8", "exact",
     ["--arch", "llama", "--type", "q8_0", "--rope-freqs", "--dim", "128", "--layers", "2",
      "--heads", "8", "--kv-heads", "1", "--ff", "256", "--vocab", "384", "--rope-base", "500000",
      "--seed", "25"], LONG_PROMPT),
    ("llama-bf16-rope-linear4", "exact",
     ["--arch", "llama", "--type", "bf16", "--rope-scaling", "linear:4", "--seed", "26"] + SMALL,
     LONG_PROMPT),
    # YaRN (factor 4 over an original context of 16, so the prompt runs past it)
    ("llama-f32-rope-yarn4", "exact",
     ["--arch", "llama", "--type", "f32", "--rope-scaling", "yarn:4", "--rope-orig-ctx", "16",
      "--seed", "29"] + SMALL, LONG_PROMPT),
    ("qwen2-q8_0-rope-yarn8-gqa4", "exact",
     ["--arch", "qwen2", "--type", "q8_0", "--rope-scaling", "yarn:8", "--rope-orig-ctx", "32",
      "--rope-base", "1000000", "--dim", "128", "--layers", "2", "--heads", "8", "--kv-heads", "2",
      "--ff", "256", "--vocab", "384", "--seed", "30"], LONG_PROMPT),
    ("llama-f16-rope-freqs-yarn2", "exact",
     ["--arch", "llama", "--type", "f16", "--rope-freqs", "--rope-scaling", "yarn:2",
      "--rope-attn-factor", "1.1", "--seed", "31"] + SMALL, LONG_PROMPT),
    ("qwen2-f32-rope-none", "exact",
     ["--arch", "qwen2", "--type", "f32", "--rope-scaling", "none:4", "--seed", "27"] + SMALL),
    ("llama-f16-head-dim-32", "exact",
     ["--arch", "llama", "--type", "f16", "--head-dim", "32", "--seed", "28"] + SMALL, LONG_PROMPT),
    ("llama-f16-tied", "exact",
     ["--arch", "llama", "--type", "f16", "--tied", "--seed", "11"] + SMALL),
    ("qwen2-q8_0-tied", "exact",
     ["--arch", "qwen2", "--type", "q8_0", "--tied", "--seed", "12"] + SMALL),
    # 8 query heads per KV head, non-default RoPE base and epsilon, 3 layers.
    ("llama-f32-gqa8", "exact",
     ["--arch", "llama", "--type", "f32", "--dim", "128", "--layers", "3", "--heads", "8",
      "--kv-heads", "1", "--ff", "256", "--vocab", "384", "--rope-base", "500000",
      "--eps", "1e-6", "--seed", "13"]),
    ("qwen2-bf16-gqa4", "exact",
     ["--arch", "qwen2", "--type", "bf16", "--dim", "128", "--layers", "3", "--heads", "8",
      "--kv-heads", "2", "--ff", "192", "--vocab", "400", "--rope-base", "1000000",
      "--eps", "1e-6", "--seed", "14"]),
    # Plain multi-head attention (no grouping), GGUF v2.
    ("llama-q8_0-mha-v2", "exact",
     ["--arch", "llama", "--type", "q8_0", "--dim", "64", "--layers", "2", "--heads", "4",
      "--kv-heads", "4", "--ff", "96", "--vocab", "320", "--version", "2", "--seed", "15"]),
]


class CaseFailure(Exception):
    pass


def run(cmd, timeout=300):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=timeout)
    if p.returncode != 0:
        raise CaseFailure("%s exited %d: %s" % (os.path.basename(cmd[0]), p.returncode,
                                                (p.stderr or p.stdout).strip()[-500:]))
    return p.stdout


def parse_json_line(out):
    """The last stdout line that is a JSON object with "ids"."""
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "ids" in obj:
                return obj
    raise CaseFailure("no JSON result line in generate output: %r" % out[-300:])


def load_logits(path, n_vocab):
    rows = []
    with open(path) as f:
        for i, line in enumerate(f):
            vals = line.split()
            if not vals:
                continue
            if len(vals) != n_vocab:
                raise CaseFailure("logits line %d has %d values, want %d" % (i, len(vals), n_vocab))
            rows.append([float(v) for v in vals])
    return np.array(rows, dtype=np.float64).reshape(len(rows), n_vocab)


def check_case(tmp, name, path, args, prompt=PROMPT, ctx=256):
    model = os.path.join(tmp, name + ".gguf")
    dump = os.path.join(tmp, name + ".logits")
    run([MKMODEL, "--out", model] + args)
    out = run([GPUSWAPD, "generate", "--model", model,
               "--prompt-ids", ",".join(str(i) for i in prompt),
               "-n", str(N_GEN), "--temp", "0", "--json", "--dump-logits", dump, "--ctx", str(ctx),
               "--kv-type", "f32"]  # the reference's F32 math (F16 KV: test_forward)
              + (["--exact"] if path == "exact" else []))
    res = parse_json_line(out)
    if list(res.get("prompt_ids", [])) != prompt:
        raise CaseFailure("prompt_ids %r, want %r" % (res.get("prompt_ids"), prompt))
    ids = [int(i) for i in res["ids"]]
    if not 1 <= len(ids) <= N_GEN:
        raise CaseFailure("%d generated ids, want 1..%d" % (len(ids), N_GEN))

    m = ref.Model(model, ctx)
    eng = load_logits(dump, m.n_vocab)
    if eng.shape[0] != len(ids):
        raise CaseFailure("%d logit rows for %d generated ids" % (eng.shape[0], len(ids)))
    want = ref.forward(m, prompt + ids[:-1])
    worst = 0.0
    for k in range(len(ids)):
        row = want[len(prompt) - 1 + k]
        if path == "fast":
            if not np.all(np.isfinite(eng[k])):
                raise CaseFailure("step %d: non-finite logits" % k)
            rel = float(np.sqrt(np.mean((eng[k] - row) ** 2)) / np.std(row))
            worst = max(worst, rel / FAST_RMS)
            if rel > FAST_RMS:
                raise CaseFailure("step %d: rms(engine - ref) = %.3f of the ref's std > %.2f"
                                  % (k, rel, FAST_RMS))
            top = np.sort(row)[-2:]
            best = int(np.argmax(row))
            if top[1] - top[0] > FAST_MARGIN and ids[k] != best:
                raise CaseFailure("step %d: engine chose %d, ref argmax %d (margin %.4g)"
                                  % (k, ids[k], best, top[1] - top[0]))
            continue
        tol = TOL
        diff = float(np.max(np.abs(eng[k] - row)))
        bound = tol * max(1.0, float(np.max(np.abs(row))))
        worst = max(worst, diff / bound)
        if not np.all(np.isfinite(eng[k])):
            raise CaseFailure("step %d: non-finite logits" % k)
        if diff > bound:
            raise CaseFailure("step %d: max |engine - ref| = %.3g > %.3g (at id %d)"
                              % (k, diff, bound, int(np.argmax(np.abs(eng[k] - row)))))
        top = np.sort(row)[-2:]
        best = int(np.argmax(row))
        if top[1] - top[0] > MARGIN and ids[k] != best:
            raise CaseFailure("step %d: engine chose %d, ref argmax %d (margin %.4g)"
                              % (k, ids[k], best, top[1] - top[0]))
    return worst


DATA = os.environ.get("GPUSWAPD_DATA", "tests/data")
KQUANT = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q6_K",
          "IQ4_NL", "IQ4_XS")


def check_ref_dequant():
    """ref.py's dequantizers against the gguf package's exact first rows of
    every tensor of tests/data/kquant (|diff| <= 1e-6 max |row|): the
    reference is only a reference if it reads the stored values exactly."""
    worst, types = 0.0, set()
    for t in KQUANT:
        base = os.path.join(DATA, "kquant", "ktest-llama-%s" % t)
        g = ref.GGUF(base + ".gguf")
        with open(base + ".dequant.json") as f:
            want = json.load(f)
        for name, v in want.items():
            got = g.tensor(name)
            types.add(v["type"])
            for r, row in enumerate(v["rows"]):
                row = np.array(row, dtype=np.float64)
                rel = float(np.max(np.abs(got[r] - row)) / np.max(np.abs(row)))
                worst = max(worst, rel)
                if rel > 1e-6:
                    raise CaseFailure("%s %s row %d: max |diff| %.3g of max |row|" % (t, name, r, rel))
    if len(types) < 12:
        raise CaseFailure("only types %s in the set" % sorted(types))
    return worst


def main():
    for exe in (MKMODEL, GPUSWAPD):
        if not os.access(exe, os.X_OK):
            print("FAIL setup: %s not built (GPUSWAPD_BUILD=%s)" % (exe, BUILD))
            return 1
    failed = 0
    try:
        print("ok ref-dequantizes-kquant-exactly (worst %.3g of max |row|)" % check_ref_dequant())
    except (CaseFailure, ref.GGUFError, OSError, ValueError) as e:
        print("FAIL ref-dequantizes-kquant-exactly: %s" % e)
        failed += 1
    with tempfile.TemporaryDirectory(prefix="gpuswapd-ref-") as tmp:
        only = os.environ.get("REF_CASES")  # comma-separated substrings: run only those
        for case in CASES:
            name, path, args = case[:3]
            if only and not any(o in name for o in only.split(",")):
                continue
            try:
                worst = check_case(tmp, name, path, args, *case[3:])
                print("ok %s (worst diff %.2f of bound)" % (name, worst))
            except (CaseFailure, subprocess.TimeoutExpired, ref.GGUFError, OSError) as e:
                print("FAIL %s: %s" % (name, e))
                failed += 1
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
