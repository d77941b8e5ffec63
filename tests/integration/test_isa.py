"""GPUSWAPD_ISA (issue 43 point 3): the environment caps the CPU kernels' instruction set, so an
AVX-512 machine runs and measures the AVX2 and plain C paths; the daemon and `generate` say which
kernels run, answer as the best kernels do within rounding, and a bad value is refused."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-isa-")
SHAPE = "--type q8_0 --dim 128 --layers 2 --heads 4 --kv-heads 2 --ff 256 --vocab 300 --seed 3"


def run(env_isa, *args):
    env = dict(os.environ)
    env.pop("GPUSWAPD_ISA", None)
    if env_isa is not None:
        env["GPUSWAPD_ISA"] = env_isa
    return subprocess.run([gsd.GPUSWAPD] + list(args), capture_output=True, text=True, env=env,
                          timeout=gsd.scaled(60))


def test_a_bad_value_is_refused_naming_the_choices():
    out = run("sse9", "--check-config", "/nonexistent.yaml")
    assert out.returncode == 2, out
    assert "GPUSWAPD_ISA='sse9': expected auto, avx512, vnni, avx2 or portable" in out.stderr, out.stderr


def test_generate_runs_each_capped_path_and_agrees_with_the_best():
    import numpy as np
    model = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE)
    logits = {}
    for isa in ("auto", "avx512", "vnni", "avx2", "portable"):
        dump = os.path.join(TMP, "%s.logits" % isa)
        out = run(isa, "generate", "--model", model, "--prompt-ids", "1,5,9,13,17,21", "-n", "1",
                  "--temp", "0", "--json", "--dump-logits", dump)
        assert out.returncode == 0, (isa, out.stderr)
        got = re.search(r"CPU kernels: (\S+) \(GPUSWAPD_ISA=%s; this CPU's best: (\S+)\)" % isa,
                        out.stderr)
        assert got, (isa, out.stderr)
        used = re.search(r", (\S+) kernels;", out.stderr)
        assert used and used.group(1) == got.group(1), (isa, out.stderr)
        if isa == "portable":
            assert got.group(1) == "portable", out.stderr
        logits[isa] = np.array([float(x) for x in open(dump).readline().split()])
        print("  GPUSWAPD_ISA=%s: %s kernels (best %s)" % (isa, got.group(1), got.group(2)))
    ref = logits["auto"]
    for isa, l in logits.items():
        # the paths quantize activations and sum in their own order: Q8_0's bar (tests/data/README.md)
        rel = float(np.sqrt(np.mean((l - ref) ** 2)) / np.std(ref))
        print("  %s against auto: rms %.3f%% of the logits' std" % (isa, 100 * rel))
        assert rel < 0.06, (isa, rel)
        assert int(np.argmax(l)) == int(np.argmax(ref)), isa


def test_the_daemon_logs_its_kernels_and_answers_as_generate_does():
    model = gsd.mkmodel(os.path.join(TMP, "d.gguf"), SHAPE)
    os.environ["GPUSWAPD_ISA"] = "avx2"
    try:
        d = gsd.Daemon([("m", model, "")])  # sim backend: the same CPU kernels compute
        try:
            assert re.search(r"CPU kernels: \S+ \(GPUSWAPD_ISA=avx2", d.logtext()), d.logtext()
            ev = d.client().call({"op": "generate", "id": "g", "model": "m",
                                  "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
            assert ev["event"] == "done", ev
            want = run("avx2", "generate", "--model", model, "--prompt", "Once upon a time", "-n", "6",
                       "--temp", "0", "--json", "--quiet")
            assert want.returncode == 0, want.stderr
            assert ev["text"] == json.loads(want.stdout.strip().splitlines()[-1])["text"], (ev, want.stdout)
        finally:
            assert d.stop() == 0
    finally:
        del os.environ["GPUSWAPD_ISA"]


if __name__ == "__main__":
    r = gsd.Runner()
    for fn in [test_a_bad_value_is_refused_naming_the_choices,
               test_generate_runs_each_capped_path_and_agrees_with_the_best,
               test_the_daemon_logs_its_kernels_and_answers_as_generate_does]:
        r.run(fn)
    sys.exit(r.exit_code())
