#!/usr/bin/env bash
# On the GPU host: stop the servers serve.sh (vLLM, files in /tmp/g) and sgl-serve.sh (SGLang, /tmp/s) started (the
# NAMEd ones, else all), each by its process group (the API server and its engine processes: setsid made the server
# its group's leader), and wait until they are gone.
# usage: bash scripts/gpu/host/stopall.sh [NAME...]
set -euo pipefail
if [ $# -eq 0 ]; then for f in /tmp/g/*.pid /tmp/s/*.pid; do [ -e "$f" ] && set -- "$@" "$(basename "$f" .pid)"; done; fi
for name in "$@"; do
  G=
  for d in /tmp/g /tmp/s; do [ -f "$d/$name.pid" ] && G=$d && break; done
  [ -n "$G" ] || { echo "$name: no pid file"; continue; }
  pid=$(cat "$G/$name.pid"); rm -f "$G/$name.pid"
  if kill -TERM -- "-$pid" 2>/dev/null; then
    for _ in $(seq 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "$name stopped (process group $pid)"
  else
    echo "$name: not running"
  fi
done
