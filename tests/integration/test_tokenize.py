"""`gpuswapd tokenize` on the vendored vocabulary-only GGUFs: every llama.cpp test string gives the reference ids, --pieces reassembles the text, BOS and special-token options, errors."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

DATA = os.environ.get("GPUSWAPD_DATA", os.path.join(gsd.ROOT, "tests", "data"))
CI = os.environ.get("CI", "") not in ("", "false", "0")
SEP = b"\n__ggml_vocab_test__\n"
VOCABS = [  # (file under tests/data, SentencePiece: its pieces carry a space prefix)
    ("vocab/ggml-vocab-gpt-2.gguf", False),
    ("vocab/ggml-vocab-deepseek-llm.gguf", False),
    ("vocab/ggml-vocab-starcoder.gguf", False),
    ("ggml-vocab-llama-spm.gguf", True),
    ("stories260K.gguf", True),
]


def tokenize(model, text, *opts):
    """Runs gpuswapd tokenize with text (bytes) on stdin; returns (rc, stdout bytes, stderr str)."""
    out = subprocess.run([gsd.GPUSWAPD, "tokenize", "-m", model] + list(opts), input=text,
                         capture_output=True, timeout=gsd.scaled(60))
    return out.returncode, out.stdout, out.stderr.decode("utf-8", "replace")


def ids_of(model, text, *opts):
    rc, out, err = tokenize(model, text, *opts)
    assert rc == 0, "exit %d: %s" % (rc, err)
    assert out.endswith(b"\n") and out.count(b"\n") == 1, "want one line, got %r" % out
    return [int(x) for x in out.split()]


def reference(name):
    """The .inp strings and .out id lines of a vocabulary, or None when missing (skip, or fail under CI)."""
    paths = [os.path.join(DATA, name + ext) for ext in ("", ".inp", ".out")]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        if CI:
            raise AssertionError("reference data missing: %s" % ", ".join(missing))
        print("skip: reference data missing: %s" % ", ".join(missing))
        return None
    inp = open(paths[1], "rb").read()
    strings = inp.split(SEP)
    assert strings[-1] == b"", "%s.inp does not end with the separator" % name
    strings = strings[:-1]
    lines = open(paths[2]).read().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    assert len(lines) == len(strings), "%s: %d strings, %d id lines" % (name, len(strings), len(lines))
    return paths[0], strings, [[int(x) for x in line.split()] for line in lines]


def pieces_text(model, text):
    """Runs --pieces --no-bos and joins the pieces back into bytes; also returns the ids."""
    rc, out, err = tokenize(model, text, "--pieces", "--no-bos")
    assert rc == 0, "exit %d: %s" % (rc, err)
    ids, joined = [], b""
    for line in out.decode("utf-8", "surrogateescape").split("\n")[:-1]:
        tid, piece = line.split(" ", 1)
        ids.append(int(tid))
        joined += json.loads(piece).encode("utf-8", "surrogateescape")
    return ids, joined


def make_check(name, spm):
    def check():
        ref = reference(name)
        if ref is None:
            return
        model, strings, want = ref
        bad = []
        for i, (s, w) in enumerate(zip(strings, want)):
            got = ids_of(model, s, "--no-bos")
            if got != w:
                bad.append("string %d %r: got %s want %s" % (i, s, got, w))
        assert not bad, "%d of %d lines differ:\n  %s" % (len(bad), len(strings), "\n  ".join(bad[:5]))
        for s, w in zip(strings, want):  # the pieces spell the text again
            ids, joined = pieces_text(model, s)
            assert ids == w
            if spm and joined.startswith(b" "):
                joined = joined[1:]
            assert joined == s, "pieces give %r for %r" % (joined, s)
        print("   %s: %d/%d lines match" % (name, len(strings), len(strings)))
    check.__name__ = "reference_ids_" + os.path.basename(name).replace(".gguf", "").replace("-", "_")
    return check


def bos_is_added_when_the_vocabulary_asks_and_never_with_no_bos():
    model = os.path.join(DATA, "ggml-vocab-llama-spm.gguf")
    if reference("ggml-vocab-llama-spm.gguf") is None:
        return
    assert ids_of(model, b"Hello world") == [1, 15043, 3186]
    assert ids_of(model, b"Hello world", "--no-bos") == [15043, 3186]
    gpt2 = os.path.join(DATA, "vocab/ggml-vocab-gpt-2.gguf")
    assert ids_of(gpt2, b"Hello world") == [15496, 995]  # GPT-2 adds no BOS


def special_text_becomes_special_tokens_only_with_special():
    model = os.path.join(DATA, "ggml-vocab-llama-spm.gguf")
    if reference("ggml-vocab-llama-spm.gguf") is None:
        return
    assert ids_of(model, b"<s>hi", "--no-bos", "--special") == [1, 7251]
    plain = ids_of(model, b"<s>hi", "--no-bos")
    assert 1 not in plain and len(plain) > 2, plain


def empty_input_prints_an_empty_line_or_just_bos():
    model = os.path.join(DATA, "ggml-vocab-llama-spm.gguf")
    if reference("ggml-vocab-llama-spm.gguf") is None:
        return
    assert tokenize(model, b"", "--no-bos")[:2] == (0, b"\n")
    assert ids_of(model, b"") == [1]


def an_unknown_pre_tokenizer_is_an_error_naming_it():
    src = os.path.join(DATA, "vocab/ggml-vocab-gpt-2.gguf")
    if reference("vocab/ggml-vocab-gpt-2.gguf") is None:
        return
    blob = open(src, "rb").read()
    key = b"tokenizer.ggml.pre"
    at = blob.find(key)
    assert at > 0
    val = at + len(key) + 4 + 8  # value type (u32), string length (u64)
    assert blob[val:val + 5] == b"gpt-2", blob[val - 12:val + 8]
    bad = os.path.join(gsd.tmpdir(prefix="gsd-tokenize-"), "mystery.gguf")
    with open(bad, "wb") as f:
        f.write(blob[:val] + b"zzz-9" + blob[val + 5:])
    rc, out, err = tokenize(bad, b"hello")
    assert rc == 1 and out == b"", (rc, out)
    assert 'unknown pre-tokenizer tokenizer.ggml.pre = "zzz-9"' in err, err


def check_config_refuses_a_model_with_an_unknown_pre_tokenizer_naming_it():
    tmp = gsd.tmpdir(prefix="gsd-tokenize-")
    good = gsd.mkmodel(os.path.join(tmp, "m.gguf"), "--tok gpt2 --dim 64 --layers 1 --heads 4 --kv-heads 2 "
                       "--ff 128 --vocab 300")
    blob = open(good, "rb").read()
    at = blob.find(b"llama-bpe")
    assert at > 0
    with open(os.path.join(tmp, "bad.gguf"), "wb") as f:
        f.write(blob[:at] + b"llama-bpz" + blob[at + 9:])
    with open(os.path.join(tmp, "c.yaml"), "w") as f:
        f.write("listen:\n  socket: s.sock\nadmin:\n  socket: a.sock\ndevice:\n  backend: cpu\n"
                "models:\n  - name: good\n    path: m.gguf\n  - name: bad\n    path: bad.gguf\n")
    out = subprocess.run([gsd.GPUSWAPD, "--check-config", os.path.join(tmp, "c.yaml")], capture_output=True,
                         text=True, timeout=gsd.scaled(60))
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "model 'bad'" in out.stderr and 'unknown pre-tokenizer tokenizer.ggml.pre = "llama-bpz"' in out.stderr, \
        out.stderr
    good_lines = [l for l in out.stderr.splitlines() if "model 'good'" in l]
    assert good_lines and all("tokenizer" not in l for l in good_lines), out.stderr  # the intact file is fine


def usage_errors_exit_2():
    rc, _, err = tokenize("", b"")  # -m with an empty name still parses; a missing file is exit 1
    assert rc == 1, (rc, err)
    out = subprocess.run([gsd.GPUSWAPD, "tokenize"], input=b"", capture_output=True)
    assert out.returncode == 2 and b"--model FILE is required" in out.stderr, out
    out = subprocess.run([gsd.GPUSWAPD, "tokenize", "-m", "x", "extra"], input=b"", capture_output=True)
    assert out.returncode == 2, out
    out = subprocess.run([gsd.GPUSWAPD, "tokenize", "--help"], capture_output=True)
    assert out.returncode == 0 and b"--pieces" in out.stdout, out


def main():
    r = gsd.Runner()
    for name, spm in VOCABS:
        r.run(make_check(name, spm))
    for fn in (bos_is_added_when_the_vocabulary_asks_and_never_with_no_bos,
               special_text_becomes_special_tokens_only_with_special,
               empty_input_prints_an_empty_line_or_just_bos,
               an_unknown_pre_tokenizer_is_an_error_naming_it,
               check_config_refuses_a_model_with_an_unknown_pre_tokenizer_naming_it,
               usage_errors_exit_2):
        r.run(fn)
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
