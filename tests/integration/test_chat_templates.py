"""Chat templates in the real daemon (sim backend): a model's `chat_template:` key overrides its file, a reload changes it, and a file without a template, or with one no family matches, makes `chat` a clear bad_request."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-chat-")
DATA = os.environ.get("GPUSWAPD_DATA", os.path.join(gsd.ROOT, "tests", "data"))
REF = os.path.join(DATA, "chat", "llama-cpp-templates.json")
CI = os.environ.get("CI", "") not in ("", "false", "0")
KEY = b"tokenizer.chat_template"


def patched(src, dst, how):
    """Copies a GGUF, making its chat template unrecognisable (how="text") or its key unknown
    (how="key", so the file has no tokenizer.chat_template)."""
    blob = bytearray(open(src, "rb").read())
    at = blob.find(KEY)
    assert at > 0
    if how == "key":
        blob[at + len(KEY) - 1:at + len(KEY)] = b"X"
    else:
        off = at + len(KEY) + 4  # value type (u32 string)
        n = int.from_bytes(blob[off:off + 8], "little")
        blob[off + 8:off + 8 + n] = b"x" * n
    with open(dst, "wb") as f:
        f.write(bytes(blob))
    return dst


BASE = gsd.mkmodel(os.path.join(TMP, "base.gguf"), "--type f32 --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                   "--ff 128 --vocab 300 --seed 5")
ODD = patched(BASE, os.path.join(TMP, "odd.gguf"), "text")
NONE = patched(BASE, os.path.join(TMP, "none.gguf"), "key")
MODELS = [("odd", ODD, ""), ("none", NONE, ""), ("fixed", ODD, "chat_template: zephyr"), ("base", BASE, "")]
MSGS = [{"role": "user", "content": "Hello"}]  # the "user-only" conversation of the reference data


def chat(d, model, rid):
    c = d.client()
    try:
        return c.call({"op": "chat", "id": rid, "model": model, "messages": MSGS, "max_tokens": 2,
                       "temperature": 0})
    finally:
        c.close()


def prompt_len(model_file, text):
    """Tokens of a rendered prompt as the daemon tokenizes it: specials parsed, BOS as the vocabulary says."""
    out = subprocess.run([gsd.GPUSWAPD, "tokenize", "-m", model_file, "--special"], input=text.encode(),
                         capture_output=True, check=True)
    return len(out.stdout.split())


def rendering(family):
    return json.load(open(REF, encoding="utf-8"))["renderings"][family]["user-only"]


def main():
    if not os.path.exists(REF):
        if CI:
            print("FAIL reference data missing: %s" % REF)
            return 1
        print("skip: reference data missing: %s" % REF)
        return 0
    r = gsd.Runner()
    d = gsd.Daemon(MODELS, memory="8MiB")

    def a_template_no_family_matches_is_a_bad_request_naming_the_fix():
        ans = chat(d, "odd", 1)
        err = ans.get("error") or {}
        assert ans.get("event") == "error" and err.get("code") == "bad_request", ans
        assert "none gpuswapd knows" in err["message"] and "chat_template:" in err["message"], ans

    def a_file_without_a_template_is_a_bad_request_naming_the_fix():
        ans = chat(d, "none", 2)
        err = ans.get("error") or {}
        assert ans.get("event") == "error" and err.get("code") == "bad_request", ans
        assert "has no chat template" in err["message"] and "chat_template:" in err["message"], ans

    def the_config_key_overrides_the_file_and_renders_as_llama_cpp():
        ans = chat(d, "fixed", 3)
        assert ans.get("event") == "done", ans
        want = prompt_len(ODD, rendering("zephyr"))
        assert ans["usage"]["prompt_tokens"] == want, (ans["usage"], want)
        # the detected family of an untouched file: mkmodel's Llama 2 template (content.strip())
        ans = chat(d, "base", 4)
        assert ans["usage"]["prompt_tokens"] == prompt_len(BASE, rendering("llama2-sys-strip")), ans
        assert prompt_len(BASE, rendering("llama2-sys-strip")) != want

    def a_reload_changes_the_template():
        d.write_config([("odd", ODD, ""), ("none", NONE, ""), ("fixed", ODD, "chat_template: chatml"),
                        ("base", BASE, "")], memory="8MiB")
        ans = d.admin_call({"op": "reload", "id": "r"})
        assert ans.get("ok"), ans
        ans = chat(d, "fixed", 5)
        assert ans["usage"]["prompt_tokens"] == prompt_len(ODD, rendering("chatml")), ans
        assert prompt_len(ODD, rendering("chatml")) != prompt_len(ODD, rendering("zephyr"))

    for fn in (a_template_no_family_matches_is_a_bad_request_naming_the_fix,
               a_file_without_a_template_is_a_bad_request_naming_the_fix,
               the_config_key_overrides_the_file_and_renders_as_llama_cpp,
               a_reload_changes_the_template):
        r.run(fn)
    rc = d.stop()
    if rc != 0:
        print("FAIL daemon exit %d" % rc)
        return 1
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
