#!/usr/bin/env bash
# On the GPU host: keep carried pieces of the bundle in /tmp/acc, one call per piece (a call carries the
# checkout + at most 64 MiB), each checked against SHA256SUMS when that file was carried beside it.
# usage: bash scripts/gpu/host/stage.sh .gpu/pieces/c00      (carry .gpu/pieces/c00 and .gpu/pieces/SHA256SUMS)
#        bash scripts/gpu/host/stage.sh .gpu/sgl/s00         (the SGLang bundle: carry .gpu/sgl/s00 and .gpu/sgl/SHA256SUMS)
# The carried SHA256SUMS replaces the one in $ACC: stage one bundle and set it up (setup.sh / sgl-setup.sh, which
# delete the pieces) before staging the other.
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
# the pieces SHA256SUMS names (c00... of the vLLM bundle, s00... of the SGLang one), counted where they are staged
if [ -f "$ACC/SHA256SUMS" ]; then
  have=0 want=0
  while read -r _ name; do want=$((want + 1)); [ -f "$ACC/$name" ] && have=$((have + 1)); done < "$ACC/SHA256SUMS"
  echo "$have of $want pieces in $ACC"
else
  echo "$# piece(s) copied to $ACC; no SHA256SUMS carried: nothing checked"
fi
