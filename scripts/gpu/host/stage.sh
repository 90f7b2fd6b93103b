#!/usr/bin/env bash
# On the GPU host: keep carried pieces of the bundle in /tmp/acc, one call per piece (a call carries the
# checkout + at most 64 MiB), each checked against SHA256SUMS when that file was carried beside it.
# usage: bash scripts/gpu/host/stage.sh .gpu/pieces/c00      (carry .gpu/pieces/c00 and .gpu/pieces/SHA256SUMS)
set -euo pipefail
ACC=${ACC:-/tmp/acc}
mkdir -p "$ACC"
for piece in "$@"; do
  cp "$piece" "$ACC/"
  sums=$(dirname "$piece")/SHA256SUMS
  if [ -f "$sums" ]; then
    cp "$sums" "$ACC/"
    (cd "$ACC" && grep " $(basename "$piece")\$" SHA256SUMS | sha256sum -c -)
  fi
done
have=$(find "$ACC" -name 'c[0-9][0-9]' | wc -l)
echo "$have of $( (wc -l < "$ACC/SHA256SUMS") 2>/dev/null || echo '?') pieces in $ACC"
