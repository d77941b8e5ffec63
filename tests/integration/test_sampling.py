"""Sampling parameters end to end on the real daemon (sim backend): presence_penalty and frequency_penalty with OpenAI's semantics, checked against the raw logits of `gpuswapd generate`, and the same over the socket, HTTP, the gpuswap CLI and a model's config defaults; out-of-range values are bad_request."""
import http.client
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-sampling-")
SHAPE = "--type f16 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 256 --vocab 400 --seed 5"
PATH = gsd.mkmodel(os.path.join(TMP, "m.gguf"), SHAPE)
PROMPT = "Once upon a time"
N = 48
PP, FP = 1.5, 0.75  # presence_penalty, frequency_penalty of the penalised runs
GPUSWAP = os.path.join(gsd.BUILD, "gpuswap")


PORT = gsd.free_port()
# "plain" has the built-in defaults; "pen" is the same file with the penalties as its config defaults
MODELS = [("plain", PATH, "defaults:\n  temperature: 0"),
          ("pen", PATH, "defaults:\n  temperature: 0\n  presence_penalty: %g\n  frequency_penalty: %g" % (PP, FP))]
D = None


def one_shot(extra, dump=None):
    """`gpuswapd generate` greedy with extra options: the --json object."""
    args = [gsd.GPUSWAPD, "generate", "--model", PATH, "--prompt", PROMPT, "-n", str(N), "--temp", "0",
            "--json", "--quiet", "--threads", "1", "--ignore-eos"] + list(extra)
    if dump:
        args += ["--dump-logits", dump]
    out = subprocess.run(args, capture_output=True, text=True, timeout=gsd.scaled(120))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def openai_penalties_match_the_raw_logits():
    """Each greedy pick is the argmax of logit - fp * count - pp * (count > 0) over the
    tokens generated before it (the prompt does not count), from the unpenalised logits."""
    plain = one_shot([])
    for pp, fp in ((PP, FP), (-1.5, -0.5)):
        check_against_logits(pp, fp, plain["ids"])


def check_against_logits(pp, fp, plain_ids):
    dump = os.path.join(TMP, "logits.txt")
    got = one_shot(["--presence-penalty", str(pp), "--frequency-penalty", str(fp)], dump)
    assert got["ids"] != plain_ids, "the penalties changed nothing: %s" % got["ids"]
    with open(dump) as f:
        steps = [[float(x) for x in line.split()] for line in f]
    assert len(steps) == len(got["ids"]) == N, (len(steps), len(got["ids"]))
    counts = {}
    for k, (logits, picked) in enumerate(zip(steps, got["ids"])):
        pen = list(logits)
        for t, c in counts.items():
            pen[t] -= fp * c + pp
        best = max(range(len(pen)), key=lambda i: (pen[i], -i))
        # ties within float rounding are allowed to go either way
        assert best == picked or abs(pen[best] - pen[picked]) < 1e-4, (k, best, picked)
        counts[picked] = counts.get(picked, 0) + 1
    os.unlink(dump)


def socket_http_cli_and_config_defaults_agree_with_the_one_shot_engine():
    no_eos = one_shot(["--presence-penalty", str(PP), "--frequency-penalty", str(FP)])
    want = one_shot_text(["--presence-penalty", str(PP), "--frequency-penalty", str(FP)])
    plain = one_shot_text([])
    assert want != plain, "penalties should change the text"
    assert no_eos["ids"], no_eos
    # socket: explicit fields on the plain model, and the config defaults of "pen"
    c = D.client()
    a = c.call({"op": "generate", "id": 1, "model": "plain", "prompt": PROMPT, "max_tokens": N,
                "presence_penalty": PP, "frequency_penalty": FP})
    b = c.call({"op": "generate", "id": 2, "model": "pen", "prompt": PROMPT, "max_tokens": N})
    p = c.call({"op": "generate", "id": 3, "model": "plain", "prompt": PROMPT, "max_tokens": N})
    # a request's own value wins over the model's default
    z = c.call({"op": "generate", "id": 4, "model": "pen", "prompt": PROMPT, "max_tokens": N,
                "presence_penalty": 0, "frequency_penalty": 0})
    c.close()
    for ev in (a, b, p, z):
        assert ev.get("event") == "done", ev
    assert a["text"] == want, (a["text"], want)
    assert b["text"] == want, (b["text"], want)
    assert p["text"] == plain and z["text"] == plain, (p["text"], z["text"], plain)
    # HTTP completions and chat-free completions with the OpenAI names
    status, body = http_post("/v1/completions", {"model": "plain", "prompt": PROMPT, "max_tokens": N,
                                                 "presence_penalty": PP, "frequency_penalty": FP})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == want, body
    # CLI
    out = subprocess.run([GPUSWAP, "--socket", D.sock, "--admin-socket", D.admin, "generate", "-m", "plain",
                          "-n", str(N), "--presence-penalty", str(PP), "--frequency-penalty", str(FP), "--json",
                          PROMPT], capture_output=True, text=True, timeout=gsd.scaled(60))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["text"] == want, out.stdout


def one_shot_text(extra):
    """The one-shot engine's text, stopping at end-of-generation as the daemon does."""
    args = [gsd.GPUSWAPD, "generate", "--model", PATH, "--prompt", PROMPT, "-n", str(N), "--temp", "0",
            "--json", "--quiet", "--threads", "1"] + list(extra)
    out = subprocess.run(args, capture_output=True, text=True, timeout=gsd.scaled(120))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["text"]


def http_post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=gsd.scaled(60))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def out_of_range_penalties_are_bad_request_everywhere():
    c = D.client()
    for field, v in (("presence_penalty", 2.5), ("frequency_penalty", -2.01), ("presence_penalty", "x")):
        ev = c.call({"op": "generate", "id": 9, "model": "plain", "prompt": PROMPT, field: v})
        assert ev["error"]["code"] == "bad_request" and field in ev["error"]["message"], ev
    c.close()
    status, body = http_post("/v1/completions", {"model": "plain", "prompt": PROMPT, "frequency_penalty": 3})
    assert status == 400 and b"frequency_penalty" in body and b"[-2, 2]" in body, (status, body)
    out = subprocess.run([GPUSWAP, "--socket", D.sock, "generate", "-m", "plain", "--presence-penalty", "9",
                          PROMPT], capture_output=True, text=True, timeout=gsd.scaled(60))
    assert out.returncode == 1 and "bad_request" in out.stderr and "presence_penalty" in out.stderr, out
    out = subprocess.run([GPUSWAP, "generate", "-m", "plain", "--frequency-penalty", "lots", PROMPT],
                         capture_output=True, text=True, timeout=gsd.scaled(60))
    assert out.returncode == 2 and "invalid value 'lots'" in out.stderr, out


def a_config_default_out_of_range_stops_startup():
    cfg = os.path.join(TMP, "bad.yaml")
    with open(cfg, "w") as f:
        f.write("device:\n  backend: sim\nmodels:\n  - name: x\n    path: %s\n    defaults:\n"
                "      presence_penalty: 2.5\n" % PATH)
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", cfg], capture_output=True, text=True,
                         timeout=gsd.scaled(60))
    assert out.returncode != 0 and "presence_penalty" in out.stderr and "between -2 and 2" in out.stderr, out


def help_lists_the_table():
    out = subprocess.run([GPUSWAP, "generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for opt in ("--presence-penalty F", "--frequency-penalty F", "in [-2, 2]", "(built in: 0.8)"):
        assert opt in out.stdout, (opt, out.stdout)
    out = subprocess.run([gsd.GPUSWAPD, "generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--presence-penalty" in out.stdout, out


def main():
    global D
    D = gsd.Daemon(MODELS, memory="8MiB", listen="http: 127.0.0.1:%d" % PORT)
    r = gsd.Runner()
    try:
        for fn in (openai_penalties_match_the_raw_logits,
                   socket_http_cli_and_config_defaults_agree_with_the_one_shot_engine,
                   out_of_range_penalties_are_bad_request_everywhere,
                   a_config_default_out_of_range_stops_startup,
                   help_lists_the_table):
            r.run(fn)
    finally:
        assert D.stop() == 0
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
