#!/usr/bin/env bash
# On the GPU host, with up.sh's bf16 and fp8 servers running (docs/audit.md, "On a GPU"): N long outputs generated
# on fp8, then `kvqual audit` of them against bf16 (and, with CANDIDATE=1, again with --candidate fp8), each step
# timed; the audit reports are copied to $OUT.   usage: bash scripts/gpu/audit.sh [N=2000] [MAX_TOKENS=1024] [CONCURRENCY=256]
# The outputs are generated with top-1 logprobs: what gives kvqual the token ids (the audit scores by ids).
# Long: run it in the background and read its log (each device call ends after 10 minutes):
#   setsid bash scripts/gpu/audit.sh > /tmp/g/audit.log 2>&1 < /dev/null &
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2000} MAXTOK=${2:-1024} CONC=${3:-256}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON SITE=; else PY=python3 SITE=:${KVQ_SITE:-/tmp/g/site}; fi
W=${KVQUAL_OUT:-results}/audit-inputs; mkdir -p "$W"
"$PY" scripts/gpu/long_prompts.py "$N" "$MAXTOK" > "$W/long.jsonl"
t=$(date +%s)
bash scripts/gpu/kvqual.sh run fp8 --suite "$W/long.jsonl" --concurrency "$CONC" --top-logprobs 1 | tee "$W/run.txt"
echo "generation on fp8: $(( $(date +%s) - t )) s"
run=$(sed -n 's/.*→ //p' "$W/run.txt" | tail -n 1)
PYTHONPATH=$PWD/src$SITE "$PY" scripts/outputs_from_run.py "$run" "$W/fp8-outputs.jsonl"
extras=("")
[ "${CANDIDATE:-0}" = 1 ] && extras+=("--candidate fp8")
for extra in "${extras[@]}"; do
  t=$(date +%s)
  # shellcheck disable=SC2086  # extra is two words or none
  bash scripts/gpu/kvqual.sh audit "$W/fp8-outputs.jsonl" --against bf16 $extra --looks 1 --sample "$N" \
    --concurrency "$CONC" --max-minutes 0 || true
  echo "audit against bf16 ${extra:-(no candidate)}: $(( $(date +%s) - t )) s"
done
