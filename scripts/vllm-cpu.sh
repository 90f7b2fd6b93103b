#!/usr/bin/env bash
# Serve the embedded default's weights with real vLLM (CPU build) from .venv-vllm; extra flags go
# to vLLM (--port, --kv-cache-dtype auto|fp8, ...). `bash scripts/setup-vllm.sh` installs both.
#   KVQUAL_VLLM_MODEL   the model folder (default: the export setup-vllm.sh writes)
#   VLLM_CPU_KVCACHE_SPACE  GiB of KV cache (default 1: 46,592 bf16 tokens, 93,184 fp8), unless
#                       --kv-cache-memory-bytes is given
set -euo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
CACHE="${KVQUAL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvqual}"
MODEL="${KVQUAL_VLLM_MODEL:-$CACHE/hf/SmolLM2-135M-Instruct}"
PY="${KVQUAL_VLLM_PYTHON:-$ROOT/.venv-vllm/bin/python}"
[ -x "$PY" ] || { echo "vllm-cpu.sh: $PY not found; run: bash scripts/setup-vllm.sh" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "vllm-cpu.sh: no model folder at $MODEL; run: bash scripts/setup-vllm.sh" >&2; exit 2; }
# vLLM lets the environment variable override --kv-cache-memory-bytes: a byte budget on the command
# line must come without it
case " $* " in
  *" --kv-cache-memory-bytes"*) unset VLLM_CPU_KVCACHE_SPACE ;;
  *) export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" ;;
esac
# the `vllm` console script fails in this distribution (it is named vllm-cpu): use the module
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name SmolLM2-135M-Instruct \
  --dtype bfloat16 --max-model-len 8192 --enforce-eager "$@"
