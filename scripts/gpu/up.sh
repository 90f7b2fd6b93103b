#!/usr/bin/env bash
# On the GPU host, from the checkout: setup (once: unpack the staged bundle, export the model), then the vLLM
# servers that scripts/gpu/kvqual-gpu.toml names, started together, and wait until all answer:
#   bf16 :8001 and bf16b :8002 (the A/A pair), fp8 :8003 (--kv-cache-dtype fp8), fp8_scales :8004 (fp8 with
#   --calculate-kv-scales); bf16_bi :8005 (bf16 under VLLM_BATCH_INVARIANT=1, not in the default set). Each gets the same KV cache memory (KV_BYTES, serve.sh), so capacities compare.
# usage: bash scripts/gpu/up.sh [NAME...]          (default: all four; the servers' logs are copied to $OUT)
# Again while servers run or start: they are left alone, and waited for. Env: see host/serve.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A SPEC=([bf16]="8001 auto" [bf16b]="8002 auto" [fp8]="8003 fp8" [fp8_scales]="8004 fp8 --calculate-kv-scales"
                 [bf16_bi]="8005 auto VLLM_BATCH_INVARIANT=1")
[ $# -gt 0 ] || set -- bf16 bf16b fp8 fp8_scales
trap '[ -z "${OUT:-}" ] || cp /tmp/g/*.log "$OUT"/ 2> /dev/null || true' EXIT
start=$(date +%s)
if [ -z "${PYTHON:-}" ]; then  # PYTHON set: vLLM installed there, the model exported already (docs/gpu.md)
  bash scripts/gpu/host/setup.sh
  echo "setup done after $(( $(date +%s) - start )) s"
fi
specs=()
for name in "$@"; do
  [ -n "${SPEC[$name]:-}" ] || { echo "unknown server $name (known: ${!SPEC[*]})"; exit 2; }
  specs+=("$name ${SPEC[$name]}")
done
bash scripts/gpu/host/serve.sh "${specs[@]}"
bash scripts/gpu/host/wait.sh "$@"
echo "all up after $(( $(date +%s) - start )) s"
