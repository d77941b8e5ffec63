#!/usr/bin/env bash
# The schema corpus (issue 40, docs/CONSTRAINED.md "Schema corpus"): the 80 real-world schemas of
# tests/data/schemas/jsonschemabench-sample.json, each sent as response_format json_schema over HTTP
# /v1/chat/completions with BENCH_SCHEMA_SEEDS (5) seeds (temperature 1, max_tokens
# BENCH_SCHEMA_MAX_TOKENS, 65000) to gpuswapd (cpu backend) on a generated tiny model; every output
# that finished with "stop" is validated with ajv (tests/node, pinned by its package-lock.json).
# Counts refused schemas (by the keyword the refusal names) and valid, invalid and length-cut
# outputs; writes OUTDIR/schemas.csv and OUTDIR/schemas.json. Fails on an invalid finished output.
#
# usage: run_schemas.sh BUILD [OUTDIR]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$BUILD/bench}
CORPUS=tests/data/schemas/jsonschemabench-sample.json
if ! command -v node >/dev/null 2>&1; then
    echo "run_schemas.sh: skip: node not installed"
    exit 0
fi
if [ ! -d tests/node/node_modules/ajv ]; then
    echo "run_schemas.sh: tests/node/node_modules/ajv is missing (make deps)" >&2
    exit 1
fi
SD=$(realpath -m "$OUT/schemas") # absolute: the config's paths resolve beside it
mkdir -p "$SD"
m=$SD/tiny-ctx64k.gguf # a long context: unbounded strings of a random model end, given room
[ -f "$m" ] || "$BUILD/mkmodel" --out "$m" --type f16 --dim 64 --layers 2 --heads 2 --kv-heads 1 \
    --ff 128 --vocab 600 --ctx 65536 --seed 11 >/dev/null
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$SD/gpuswapd.yaml" <<CFG
listen:
  socket: $SD/s.sock
  http: 127.0.0.1:$port
admin:
  socket: $SD/a.sock
device:
  backend: cpu
  threads: 1
scheduler:
  max_batch: 8
models:
  - name: tiny
    path: $m
    max_context: 65536
CFG
rm -f "$SD/s.sock" "$SD/a.sock"
"$BUILD/gpuswapd" --config "$SD/gpuswapd.yaml" 2> "$SD/daemon.log" &
dpid=$!
trap 'kill -TERM $dpid 2>/dev/null; wait $dpid 2>/dev/null || true' EXIT
for _ in $(seq 200); do
    [ -S "$SD/s.sock" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.05
done
echo "== schema corpus: $(grep -c '"git_blob"' "$CORPUS") real-world schemas (JSONSchemaBench sample, tests/data/schemas)," \
     "${BENCH_SCHEMA_SEEDS:-5} seeds each, temperature 1, max_tokens ${BENCH_SCHEMA_MAX_TOKENS:-65000}," \
     "tiny generated model (vocab 600), validated with ajv"
rc=0
SEEDS=${BENCH_SCHEMA_SEEDS:-5} MAX_TOKENS=${BENCH_SCHEMA_MAX_TOKENS:-65000} \
    node tests/node/schema_corpus.mjs "http://127.0.0.1:$port/v1" tiny "$CORPUS" "$SD" || rc=$?
echo "results: $SD/schemas.csv $SD/schemas.json"
if [ "$rc" -ne 0 ]; then
    echo "run_schemas.sh: a finished output failed validation or a request failed; the daemon said:" >&2
    tail -5 "$SD/daemon.log" >&2
fi
exit "$rc"
