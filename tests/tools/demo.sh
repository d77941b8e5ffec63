#!/usr/bin/env bash
# make run: generates the demo models, starts gpuswapd in the foreground on config/dev.yaml
# (sim backend unless a GPU is visible) and sends a little warm-up traffic so paging shows.
set -euo pipefail
BUILD=${1:-build}
D=$BUILD/demo
mkdir -p "$D/run"
mk() { [ -f "$D/$1" ] || "$BUILD/mkmodel" --out "$D/$1" "${@:2}" >/dev/null; }
mk tiny-llama-f16.gguf  --type f16  --dim 256 --layers 6 --heads 8 --kv-heads 4 --ff 768 --vocab 2000 --seed 1
mk tiny-llama-q8_0.gguf --type q8_0 --dim 256 --layers 6 --heads 8 --kv-heads 4 --ff 768 --vocab 2000 --seed 2
mk tiny-qwen-bf16.gguf  --arch qwen2 --type bf16 --dim 256 --layers 6 --heads 8 --kv-heads 2 --ff 768 --vocab 2000 --seed 3
mk tiny-llama-f32.gguf  --type f32  --dim 256 --layers 6 --heads 8 --kv-heads 4 --ff 768 --vocab 2000 --seed 4
cfg=config/dev.yaml
if [ "$BUILD" != build ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    cfg=$D/run/dev.yaml
    sed -e "s#\.\./build/demo#$PWD/$D#g" config/dev.yaml > "$cfg"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        sed -i -e 's/backend: sim/backend: cuda/' -e 's/memory: 24MiB/memory: 0/' \
            -e 's/page_size: 256KiB/page_size: 2MiB/' -e '/sim_bandwidth/d' "$cfg"
    fi
fi
# the sockets as seen from here (config paths are relative to the config's directory)
rel() { (cd "$(dirname "$cfg")" && realpath -m --relative-to="$OLDPWD" "$1"); }
sock=$(rel "$(sed -n 's/^  socket: //p' "$cfg" | head -1)")
admin=$(rel "$(sed -n 's/^  socket: //p' "$cfg" | sed -n 2p)")
cat <<MSG
gpuswapd demo: $cfg, models in $D (random weights: the text is noise, the computation is real).
Talk to it from another terminal:
  $BUILD/gpuswap --socket $sock generate -m tiny-llama-f16 "Once upon a time"
  $BUILD/gpuswap --admin-socket $admin stats
  echo '{"op":"generate","id":1,"model":"tiny-qwen-bf16","prompt":"Hello","max_tokens":16}' | \\
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect("$sock"); s.sendall(sys.stdin.buffer.read()); print(s.makefile().readline())'
Ctrl-C drains and stops it.
MSG
# warm-up traffic in the background: a few requests to every model
(
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    /usr/bin/python3 - "$sock" <<'PY' || true
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
names = ["tiny-llama-f16", "tiny-llama-q8", "tiny-qwen-bf16", "tiny-llama-f32"]
for i in range(8):
    f.write(json.dumps({"op": "generate", "id": i, "model": names[i % 4], "prompt": "Once upon a time",
                        "max_tokens": 8, "temperature": 0}) + "\n")
f.flush()
for _ in range(8):
    ev = json.loads(f.readline())
    print("demo: %s -> %s in %.1f ms (swapped: %s)" % (names[ev["id"] % 4], ev.get("finish_reason", ev.get("error")),
          ev.get("timing", {}).get("total_ms", 0), ev.get("timing", {}).get("swapped")), flush=True)
PY
) &
exec "$BUILD/gpuswapd" --config "$cfg"
