#!/usr/bin/env bash
# On the GPU host: kvqual.sh for the SGLang bundle: kvqual from the checkout's src/ with kvq/ (/tmp/s/kvq: openai 3.x
# and the rest kvqual lacks on the host; never sgl/, whose openai 2.6.1 is the server's), config
# scripts/gpu/kvqual-sgl.toml by default. Everything else as kvqual.sh (results/, report folders to $OUT).
# usage: bash scripts/gpu/kvqual-sgl.sh compare sgl_bf16 sgl_bf16b
set -euo pipefail
cd "$(dirname "$0")/../.."
KVQ_SITE=/tmp/s/kvq KVQUAL_CONFIG=${KVQUAL_CONFIG:-scripts/gpu/kvqual-sgl.toml} exec bash scripts/gpu/kvqual.sh "$@"
