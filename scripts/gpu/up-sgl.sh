#!/usr/bin/env bash
# On the GPU host, from the checkout: the SGLang bundle's setup (once: unpack the staged pieces s00..., export the
# model, import checks: host/sgl-setup.sh), then the SGLang servers that scripts/gpu/kvqual-sgl.toml names, started
# together, and wait until all answer:
#   sgl_bf16 :30001 and sgl_bf16b :30004 (the A/A pair), sgl_fp8 :30002 (--kv-cache-dtype fp8_e4m3),
#   sgl_bf16_hi :30003 and sgl_fp8_hi :30005 (the same two with --enable-hierarchical-cache),
#   sgl_det :30006 and sgl_detb :30007 (bf16 with --enable-deterministic-inference: its A/A pair);
#   fa3_bf16 :30011, fa3_bf16b :30012, fa3_fp8 :30013, fa3_bf16_hi :30014, fa3_fp8_hi :30015: the same five configs
#   with --attention-backend fa3, SGLang's own choice on a Hopper GPU (needs the FA3 add-on, bundle-fa3.sh, staged
#   in /tmp/acc-fa3: host/sgl-fa3.sh unpacks it when one of them is asked for).
# Each gets the same KV cache memory (KV_BYTES, host/sgl-serve.sh), so capacities compare.
# usage: bash scripts/gpu/up-sgl.sh [NAME...]     (default: sgl_bf16 sgl_bf16b sgl_fp8; the servers' logs go to $OUT)
# Again while servers run or start: they are left alone, and waited for. Env: see host/sgl-serve.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A SPEC=([sgl_bf16]="30001 auto" [sgl_bf16b]="30004 auto" [sgl_fp8]="30002 fp8_e4m3"
                 [sgl_bf16_hi]="30003 auto --enable-hierarchical-cache"
                 [sgl_fp8_hi]="30005 fp8_e4m3 --enable-hierarchical-cache"
                 [sgl_det]="30006 auto --enable-deterministic-inference"
                 [sgl_detb]="30007 auto --enable-deterministic-inference"
                 [fa3_bf16]="30011 auto --attention-backend fa3" [fa3_bf16b]="30012 auto --attention-backend fa3"
                 [fa3_fp8]="30013 fp8_e4m3 --attention-backend fa3"
                 [fa3_bf16_hi]="30014 auto --attention-backend fa3 --enable-hierarchical-cache"
                 [fa3_fp8_hi]="30015 fp8_e4m3 --attention-backend fa3 --enable-hierarchical-cache")
[ $# -gt 0 ] || set -- sgl_bf16 sgl_bf16b sgl_fp8
trap '[ -z "${OUT:-}" ] || cp /tmp/s/*.log "$OUT"/ 2> /dev/null || true' EXIT
start=$(date +%s)
if [ -z "${PYTHON:-}" ]; then  # PYTHON set: SGLang installed there, the model exported already (docs/gpu.md)
  bash scripts/gpu/host/sgl-setup.sh
  echo "setup done after $(( $(date +%s) - start )) s"
fi
specs=()
for name in "$@"; do
  [ -n "${SPEC[$name]:-}" ] || { echo "unknown server $name (known: ${!SPEC[*]})"; exit 2; }
  specs+=("$name ${SPEC[$name]}")
done
case " ${specs[*]} " in *"--attention-backend fa3"*) bash scripts/gpu/host/sgl-fa3.sh ;; esac
bash scripts/gpu/host/sgl-serve.sh "${specs[@]}"
bash scripts/gpu/host/wait.sh "$@"
echo "all up after $(( $(date +%s) - start )) s"
