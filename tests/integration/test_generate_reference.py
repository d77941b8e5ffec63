"""`gpuswapd generate` reproduces llama.cpp's recorded greedy outputs for the real stories260K model (F32, F16, BF16; F32 and F16 KV caches)."""
import json
import os
import subprocess
import sys
import tempfile

BUILD = os.environ.get("GPUSWAPD_BUILD", "build")
MODELS = os.environ.get("GPUSWAPD_DATA", "tests/data")  # the vendored reference data (its README)
CI = os.environ.get("CI", "") not in ("", "false", "0")
GPUSWAPD = os.path.join(BUILD, "gpuswapd")
MARGIN = 0.02   # steps at or past the first margin below this may legitimately differ
LOGIT_TOL = 1e-3

CASES = [
    ("stories260K.gguf", "greedy_once-upon-a-time_n128_kvf32.json", "logits_step0_once-upon-a-time_kvf32.txt"),
    ("stories260K.gguf", "greedy_lily-went-to-the-park_n128_kvf32.json", "logits_step0_lily-went-to-the-park_kvf32.txt"),
    ("stories260K.gguf", "greedy_the-cat_n128_kvf32.json", "logits_step0_the-cat_kvf32.txt"),
    ("stories260K.gguf", "greedy_bos-only_n256_kvf32.json", None),
]
for p in ("once-upon-a-time", "lily-went-to-the-park", "the-cat"):
    # llama.cpp's default F16 KV cache against ours (the default)
    CASES.append(("stories260K.gguf", "greedy_%s_n128_kvf16.json" % p, "logits_step0_%s_kvf16.txt" % p))
CASES.append(("stories260K.gguf", "greedy_bos-only_n256_kvf16.json", None))
for p in ("once-upon-a-time", "lily-went-to-the-park", "the-cat"):
    CASES.append(("stories260K-F16.gguf", "greedy_%s_n64_F16.json" % p, None))
    CASES.append(("stories260K-BF16.gguf", "greedy_%s_n64_BF16.json" % p, None))


def run_case(model, ref_name, logits_name, tmp):
    ref = json.load(open(os.path.join(MODELS, "reference", ref_name)))
    steps = ref["steps"]
    dump = os.path.join(tmp, "logits.txt")
    args = [GPUSWAPD, "generate", "--model", os.path.join(MODELS, model),
            "--prompt", ref["prompt"], "-n", str(len(steps)), "--temp", "0",
            "--ignore-eos", "--json", "--quiet", "--dump-logits", dump,
            # every reference but the kvf16 ones ran with an F32 KV cache
            "--kv-type", "f16" if "_kvf16" in ref_name else "f32"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return "exit %d: %s" % (out.returncode, out.stderr.strip())
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["prompt_ids"] != ref["prompt_ids"]:
        return "prompt ids %s, reference %s" % (got["prompt_ids"], ref["prompt_ids"])
    upto = next((i for i, s in enumerate(steps) if s["margin"] < MARGIN), len(steps))
    for i in range(upto):
        if got["ids"][i] != steps[i]["id"]:
            return "step %d: id %d, reference %d (margin %.4f)" % (i, got["ids"][i], steps[i]["id"], steps[i]["margin"])
    if upto == len(steps) and got["text"] != ref["text"]:
        return "text differs: %r vs %r" % (got["text"], ref["text"])
    note = "%d/%d steps" % (upto, len(steps))
    if logits_name:
        want = {}
        for line in open(os.path.join(MODELS, "reference", logits_name)):
            i, v = line.split()
            want[int(i)] = float(v)
        step0 = [float(x) for x in open(dump).readline().split()]
        if len(step0) != len(want):
            return "%d step-0 logits, reference has %d" % (len(step0), len(want))
        d = max(abs(step0[i] - v) for i, v in want.items())
        if d > LOGIT_TOL:
            return "step-0 logits differ by %g (> %g)" % (d, LOGIT_TOL)
        note += ", step-0 max |diff| %.2g" % d
    return "ok " + note


def main():
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model, ref_name, logits_name in CASES:
            missing = [f for f in (model, "reference/" + ref_name) if not os.path.exists(os.path.join(MODELS, f))]
            if missing:  # a clone carries every file: under CI a missing one fails
                print("%s: reference data missing: %s" % ("FAIL" if CI else "skip", ", ".join(missing)))
                fails += CI
                continue
            r = run_case(model, ref_name, logits_name, tmp)
            ok = r.startswith("ok")
            fails += not ok
            print("%s %s %s%s" % ("ok  " if ok else "FAIL", model, ref_name, (": " + r) if not ok else " (" + r[3:] + ")"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
