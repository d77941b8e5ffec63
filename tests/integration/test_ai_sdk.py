"""The Vercel AI SDK against the real daemon (issue 41): the pinned `ai` and `@ai-sdk/openai` npm packages
(tests/node/package-lock.json) run tests/node/ai_tools.mjs through openai.chat() (chat completions) on
gpuswapd's HTTP listener (sim backend, a generated qwen2 model carrying Qwen2.5-Instruct's template, so
the hermes tool style). Asserts that generateText and streamText each get exactly one tool call, whose
arguments the SDK parsed and validated against the tool's schema (zod, and jsonSchema), for a named
toolChoice over two tools and for toolChoice 'required' with one tool (the daemon then enforces that
tool's parameters); that streamText's and generateText's calls are the same (temperature 0); and that
the round trips work: the assistant's call and a tool result passed back as the SDK's messages
(generateText), and an execute function with stopWhen (streamText), the daemon answering the second
request, with the tool message in it, without error."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import gsd  # noqa: E402

TMP = gsd.tmpdir(prefix="gsd-aisdk-")
DATA = os.environ.get("GPUSWAPD_DATA", os.path.join(gsd.ROOT, "tests", "data"))
QWEN = os.path.join(DATA, "templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
NODE_DIR = os.path.join(gsd.ROOT, "tests", "node")
PORT = gsd.free_port()
CHECKS = ("generate_named", "stream_named", "generate_required", "stream_required",
          "generate_round_trip", "stream_round_trip")


def ai_sdk_tool_calls_streamed_and_not_and_round_trips():
    node = shutil.which("node")
    if not node:
        print("skip: node not installed (the ai npm client test)")
        return
    for pkg in ("ai", os.path.join("@ai-sdk", "openai"), "zod"):
        assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", pkg)), \
            "the %s npm package is not in %s (make deps)" % (pkg, NODE_DIR)
    out = subprocess.run([node, os.path.join(NODE_DIR, "ai_tools.mjs"), "http://127.0.0.1:%d/v1" % PORT, "qwen"],
                         capture_output=True, text=True, timeout=gsd.scaled(60), cwd=NODE_DIR)
    print(out.stdout, end="", flush=True)
    lines = out.stdout.splitlines()
    failed = [l[:300] for l in lines if l.startswith("FAIL")]
    assert out.returncode == 0 and not failed, "exit %d: %s %s" % (out.returncode, failed, out.stderr[-2000:])
    for name in CHECKS:
        assert any(l.startswith("ok %s " % name) for l in lines), (name, out.stdout)


def main():
    model = gsd.mkmodel(os.path.join(TMP, "qwen.gguf"), "--arch qwen2 --type f32 --dim 64 --layers 2 --heads 4 "
                        "--kv-heads 2 --ff 128 --vocab 600 --seed 7 --chat-template " + QWEN)
    d = gsd.Daemon([("qwen", model, "")], memory="8MiB", listen="http: 127.0.0.1:%d" % PORT)
    r = gsd.Runner()
    try:
        r.run(ai_sdk_tool_calls_streamed_and_not_and_round_trips)
    finally:
        assert d.stop() == 0
    return r.exit_code()


if __name__ == "__main__":
    sys.exit(main())
