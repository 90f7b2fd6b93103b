#!/usr/bin/env bash
# On the GPU host: wait until each named server (serve.sh's or sgl-serve.sh's NAMEs) answers; print how long each
# took from its start and the KV cache size its log reports; stop at once when one has died (its log's tail).
# A server's files are in /tmp/g (vLLM, serve.sh) or /tmp/s (SGLang, sgl-serve.sh), wherever NAME.port is. It is up
# when the path in NAME.probe answers (SGLang: /health, which waits for its warm-up), else /v1/models (vLLM).
# usage: bash scripts/gpu/host/wait.sh NAME...      (WAIT_S: give up after this many seconds, default 420)
set -euo pipefail
t0=$(date +%s)
declare -A D
for name in "$@"; do
  for d in /tmp/g /tmp/s; do [ -f "$d/$name.port" ] && D[$name]=$d && break; done
  [ -n "${D[$name]:-}" ] || { echo "$name: no $name.port in /tmp/g or /tmp/s (not started by serve.sh / sgl-serve.sh)"; exit 1; }
done
left=("$@")
while [ ${#left[@]} -gt 0 ]; do
  next=()
  for name in "${left[@]}"; do
    G=${D[$name]}
    probe=$(cat "$G/$name.probe" 2> /dev/null || echo /v1/models)
    if curl -sf "127.0.0.1:$(cat "$G/$name.port")$probe" > /dev/null; then
      kv=$(grep -m1 -oE 'KV cache size: [0-9,]+ tokens|KV Cache is allocated\. dtype: [^,]+, #tokens: [0-9]+' "$G/$name.log" || true)
      echo "$name up on port $(cat "$G/$name.port") after $(( $(date +%s) - $(cat "$G/$name.t0") )) s; ${kv:-KV size not in log}"
    elif ! kill -0 "$(cat "$G/$name.pid")" 2>/dev/null; then
      echo "$name DIED; $G/$name.log ends:"; tail -30 "$G/$name.log"; exit 1
    else
      next+=("$name")
    fi
  done
  left=("${next[@]}")
  [ ${#left[@]} -eq 0 ] && break
  if [ $(( $(date +%s) - t0 )) -gt "${WAIT_S:-420}" ]; then
    echo "not up after ${WAIT_S:-420} s: ${left[*]}"; for name in "${left[@]}"; do tail -5 "${D[$name]}/$name.log"; done; exit 1
  fi
  sleep 2
done
