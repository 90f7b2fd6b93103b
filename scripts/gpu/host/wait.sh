#!/usr/bin/env bash
# On the GPU host: wait until each named server (serve.sh's NAMEs) answers /v1/models; print how long each
# took from its start and the KV cache size its log reports; stop at once when one has died (its log's tail).
# usage: bash scripts/gpu/host/wait.sh NAME...      (WAIT_S: give up after this many seconds, default 420)
set -euo pipefail
G=/tmp/g t0=$(date +%s)
left=("$@")
while [ ${#left[@]} -gt 0 ]; do
  next=()
  for name in "${left[@]}"; do
    if curl -sf "127.0.0.1:$(cat "$G/$name.port")/v1/models" > /dev/null; then
      kv=$(grep -m1 -oE 'KV cache size: [0-9,]+ tokens' "$G/$name.log" || true)
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
    echo "not up after ${WAIT_S:-420} s: ${left[*]}"; for name in "${left[@]}"; do tail -5 "$G/$name.log"; done; exit 1
  fi
  sleep 2
done
