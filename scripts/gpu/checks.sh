#!/usr/bin/env bash
# On the GPU host, after up.sh: run kvqual commands one after the other, each timed, and bring back what a
# report needs in few files (the run tool returns at most 8): $OUT/checks.txt (every command, its exit code,
# wall time and console output) and $OUT/reports.tgz (report.json and report.md of every compare folder).
# usage: bash scripts/gpu/checks.sh "NAME: kvqual args" ["NAME: kvqual args" ...]
#   e.g. bash scripts/gpu/checks.sh "aa-quick: compare bf16 bf16b --suite profile:quick" "aa-pool: compare bf16 bf16b"
#   SGLang (up-sgl.sh): KVQUAL_SH=scripts/gpu/kvqual-sgl.sh bash scripts/gpu/checks.sh "sgl-aa: compare sgl_bf16 sgl_bf16b"
#   CHECK_TIMEOUT=SECONDS interrupts a command that runs longer (SIGINT: kvqual writes what it has and exits 130), so
#   one slow command leaves the next, and the files, the time of the host call
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out=${OUT:-/tmp/g/checks}
mkdir -p "$out" /tmp/g  # /tmp/g keeps each command's full output (NAME.txt), whichever bundle runs
for spec in "$@"; do
  name=${spec%%:*}
  args=${spec#*: }
  t0=$(date +%s%N)
  # shellcheck disable=SC2086  # args: a list of arguments
  OUT='' CI=true timeout -s INT "${CHECK_TIMEOUT:-0}" bash "${KVQUAL_SH:-scripts/gpu/kvqual.sh}" $args > "/tmp/g/$name.txt" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  { echo "=== $name: kvqual $args"; echo "exit $rc, wall $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
    grep -v '^[[:space:]]*$' "/tmp/g/$name.txt" | tail -45; echo; } | tee -a "$out/checks.txt"
done
# every compare's report, also those a command's --out put deeper (results/compare-NAME/compare-A-vs-B/)
find results -path '*compare-*' \( -name report.json -o -name report.md \) -print0 2> /dev/null \
  | tar czf "$out/reports.tgz" --null -T - 2> /dev/null || true
