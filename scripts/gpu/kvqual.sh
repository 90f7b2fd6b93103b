#!/usr/bin/env bash
# On the GPU host: kvqual from the checkout's src/ with the bundle's packages (/tmp/g/site). Results stay in
# results/ (or $KVQUAL_OUT; kept while the host stays warm, so finished runs are reused); the compares' report
# folders are copied to $OUT when the run tool sets it. The config defaults to scripts/gpu/kvqual-gpu.toml.
# PYTHON: a Python with kvqual's dependencies (a box with network); then the bundle is not used.
# KVQ_SITE: the bundle's packages for kvqual (default /tmp/g/site; the SGLang bundle's /tmp/s/kvq: kvqual-sgl.sh).
# usage: bash scripts/gpu/kvqual.sh compare bf16 bf16b --config scripts/gpu/kvqual-gpu.toml
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON SITE=; else PY=python3 SITE=:${KVQ_SITE:-/tmp/g/site}; fi
export PYTHONPATH=$PWD/src$SITE KVQUAL_CONFIG=${KVQUAL_CONFIG:-scripts/gpu/kvqual-gpu.toml}
rc=0
"$PY" -m kvqual "$@" || rc=$?
if [ -n "${OUT:-}" ]; then
  for d in "${KVQUAL_OUT:-results}"/compare-*/ "${KVQUAL_OUT:-results}"/audit-*-s*/; do [ -d "$d" ] && cp -r "$d" "$OUT"/; done
fi
exit $rc
