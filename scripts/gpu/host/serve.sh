#!/usr/bin/env bash
# On the GPU host: start vLLM on /tmp/g/model, one server per spec "NAME PORT KVDTYPE [VAR=value...] [more vLLM flags]"
# (VAR=value words: that server's own environment, e.g. VLLM_BATCH_INVARIANT=1),
# each in its own session (setsid: it outlives the call while the host stays warm); returns at once (wait.sh
# waits). A server running already (its pid alive, or its port answering) is left alone.
# Files: /tmp/g/NAME.{log,pid,port,t0}.
# Env: KV_BYTES (each server's KV cache, default 737,280,000 B = 32,000 bf16 tokens of SmolLM2 = 64,000 fp8:
# set, so servers started together get equal capacities), MAX_LEN (4096), GPU_UTIL (0.25: vLLM refuses to
# start unless this share of the GPU is free), VLLM_FLAGS (more flags for every server), MODEL (/tmp/g/model),
# PYTHON (a Python with vLLM installed, on a box with network; default: the host's python3 + the bundle),
# API_SERVERS (1: vLLM's HTTP front end in one process; N > 1: `vllm serve --api-server-count N`, N processes
# parsing requests and writing answers for the one engine — long echo and logprob answers are built there).
set -euo pipefail
G=/tmp/g
mkdir -p $G
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; else PY=python3; export PYTHONPATH=$G/site; fi
# the flashinfer sampler imports flashinfer, which the bundle leaves out
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
for spec in "$@"; do
  read -r name port kv flags <<< "$spec"
  envs=()
  while [[ "$flags" =~ ^([A-Z_][A-Z0-9_]*=[^[:space:]]*)[[:space:]]*(.*)$ ]]; do envs+=("${BASH_REMATCH[1]}"); flags=${BASH_REMATCH[2]}; done
  if [ -f "$G/$name.pid" ] && kill -0 "$(cat "$G/$name.pid")" 2> /dev/null; then echo "$name: running already"; continue; fi
  if curl -sf "127.0.0.1:$port/v1/models" > /dev/null; then echo "$name: port $port answers already"; continue; fi
  # each server compiles into caches of its own (two servers compiling the same graph at once share no files)
  if [ "${API_SERVERS:-1}" -gt 1 ]; then entry=(-m vllm.entrypoints.cli.main serve --api-server-count "$API_SERVERS")
  else entry=(-m vllm.entrypoints.openai.api_server); fi
  # shellcheck disable=SC2086  # flags: a list of flags
  VLLM_CACHE_ROOT=$G/cache/$name TORCHINDUCTOR_CACHE_DIR=$G/cache/$name/inductor TRITON_CACHE_DIR=$G/cache/$name/triton \
    setsid env "${envs[@]}" "$PY" "${entry[@]}" --model "${MODEL:-$G/model}" --served-model-name smollm2 \
    --host 127.0.0.1 --port "$port" --dtype bfloat16 --kv-cache-dtype "$kv" --max-model-len "${MAX_LEN:-4096}" \
    --kv-cache-memory-bytes "${KV_BYTES:-737280000}" --gpu-memory-utilization "${GPU_UTIL:-0.25}" \
    $flags ${VLLM_FLAGS:-} > "$G/$name.log" 2>&1 < /dev/null &
  echo $! > "$G/$name.pid"; echo "$port" > "$G/$name.port"; date +%s > "$G/$name.t0"
  echo "$name: pid $! port $port --kv-cache-dtype $kv $flags${envs[*]:+ (${envs[*]})}"
done
