#!/usr/bin/env bash
# On the GPU host: start SGLang 0.5.17 (the bundle's sgl/ tree, sgl-setup.sh) on /tmp/s/model, one server per spec
# "NAME PORT KVDTYPE [more sglang flags]" (KVDTYPE: auto = bf16 here, fp8_e4m3, fp8_e5m2), each in its own session
# (setsid: it outlives the call while the host stays warm); returns at once (wait.sh waits: it polls /health, which
# SGLang answers only after its warm-up request, i.e. after the first-request JIT compiles). A server running already
# (its pid alive, or its port answering) is left alone. Files: /tmp/s/NAME.{log,pid,port,t0,probe}.
# The flags are the recipe's (SGLANG.md) plus:
#   --dtype bfloat16: kvqual's export writes float32 weights, which SGLang would run as float16 (its rule for float32
#     checkpoints), making `auto` an fp16 KV cache; the vLLM servers get the same flag;
#   --max-total-tokens: every server's KV capacity is set, not profiled. SGLang sizes its pool from the memory free
#     when it starts, so servers started together got unequal pools in the recipe (1.6M and 2.4M tokens). The default
#     gives each the vLLM servers' KV memory, KV_BYTES = 737,280,000 B: SmolLM2 stores 30 layers x 3 KV heads x 64
#     dims x 2 (K, V) = 11,520 values a token, so 32,000 tokens at 2 bytes (auto/bf16) and 64,000 at 1 byte (fp8);
#     MAX_TOKENS sets one token count for all instead, and a spec's own --max-total-tokens wins (argparse: last wins);
#   --mem-fraction-static MEMF (0.25): a small share, so that each server's profile (free memory now less a slack of
#     (1 - MEMF) x the memory free before its weights loaded) stays positive while the others allocate;
#     the pool itself is the --max-total-tokens above;
#   --enable-metrics (kvqual reads the `sglang:` Prometheus figures) and --enable-cache-report (cached prompt tokens
#     in the usage of every answer).
# Env: KV_BYTES, MAX_TOKENS, MEMF, MAX_LEN (context length, 4096), SGL_FLAGS (more flags for every server), MODEL
# (/tmp/s/model), PYTHON (a Python with SGLang 0.5.17 installed, on a box with network; default: python3 + sgl/).
# usage: bash scripts/gpu/host/sgl-serve.sh "sgl_bf16 30001 auto" "sgl_fp8 30002 fp8_e4m3" ...
set -euo pipefail
S=/tmp/s
mkdir -p $S
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; else PY=python3; export PYTHONPATH=$S/sgl; fi
# TVM_FFI_CACHE_DIR: SGLang's JIT kernels (tvm_ffi, built with the host's nvcc) are shared by the servers: tvm_ffi
# and flashinfer take a file lock per kernel they build, so servers started together build each kernel once
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TVM_FFI_CACHE_DIR=$S/jit
for spec in "$@"; do
  read -r name port kv flags <<< "$spec"
  if [ -f "$S/$name.pid" ] && kill -0 "$(cat "$S/$name.pid")" 2> /dev/null; then echo "$name: running already"; continue; fi
  if curl -sf "127.0.0.1:$port/health" > /dev/null; then echo "$name: port $port answers already"; continue; fi
  case $kv in fp8*) bytes=1 ;; *) bytes=2 ;; esac
  tokens=${MAX_TOKENS:-$(( ${KV_BYTES:-737280000} / (11520 * bytes) ))}
  # shellcheck disable=SC2086  # flags: a list of flags
  setsid "$PY" -m sglang.launch_server --model-path "${MODEL:-$S/model}" --served-model-name smollm2 \
    --host 127.0.0.1 --port "$port" --dtype bfloat16 --kv-cache-dtype "$kv" \
    --attention-backend triton --sampling-backend pytorch --context-length "${MAX_LEN:-4096}" \
    --mem-fraction-static "${MEMF:-0.25}" --max-total-tokens "$tokens" --cuda-graph-max-bs 64 \
    --enable-metrics --enable-cache-report $flags ${SGL_FLAGS:-} > "$S/$name.log" 2>&1 < /dev/null &
  echo $! > "$S/$name.pid"; echo "$port" > "$S/$name.port"; date +%s > "$S/$name.t0"; echo /health > "$S/$name.probe"
  echo "$name: pid $! port $port --kv-cache-dtype $kv --max-total-tokens $tokens${flags:+ $flags}"
done
