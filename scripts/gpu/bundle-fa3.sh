#!/usr/bin/env bash
# Builds the FA3 add-on of the SGLang bundle for the GPU host: sgl_kernel's FlashAttention-3 extension
# (sgl_kernel/flash_ops.abi3.so, 1.1 GB unpacked, from the same sglang_kernel 0.4.5 wheel), which bundle-sglang.sh
# leaves out and `--attention-backend fa3` needs. FA3 is what SGLang 0.5.17 picks by itself for an MHA model on a
# Hopper GPU (server_args.py, `_get_default_attn_backend`: "we choose fa3 as the default backend on Hopper MHA"),
# so it is the backend a deployment like the seed's runs; the triton backend of the base bundle is not.
# Output: xz pieces of at most 58 MiB in .gpu/fa3/ (f00, f01, ... + SHA256SUMS). A piece of its own kind (fNN), so
# the base bundle's pieces and checksums stay as they were.
# On the host (docs/gpu.md): stage the base bundle as before, and these with `ACC=/tmp/acc-fa3 bash
# scripts/gpu/host/stage.sh .gpu/fa3/fNN` (carry .gpu/fa3/fNN and .gpu/fa3/SHA256SUMS), one call per piece, back
# to back; up-sgl.sh unpacks them (host/sgl-fa3.sh) when a server it starts asks for fa3.
# usage: bash scripts/gpu/bundle-fa3.sh      (needs pip, unzip, xz; ~1.1 GB in $TMPDIR for a few minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=$PWD/.gpu/wheels OUT=$PWD/.gpu/fa3
PIN=sglang_kernel==0.4.5   # the base bundle's (bundle-sglang.sh): the .so must match the sgl_kernel it joins
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" "$WHEELS" "$OUT"
grep -qxF '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
whl=("$WHEELS/${PIN%%==*}-${PIN##*==}-"*.whl)
if [ ! -f "${whl[0]}" ]; then
  plat=()
  for m in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${m}_x86_64"); done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi abi3 \
    --platform manylinux2014_x86_64 "${plat[@]}" -d "$WHEELS" "$PIN"
  whl=("$WHEELS/${PIN%%==*}-${PIN##*==}-"*.whl)
fi
rm -f "$OUT"/f[0-9][0-9] "$OUT"/SHA256SUMS
# the one file, streamed out of the wheel: no 1.1 GB of scratch
unzip -p "${whl[0]}" sgl_kernel/flash_ops.abi3.so | xz -6 -T2 | split -b 58m -d -a 2 - "$OUT/f"
(cd "$OUT" && sha256sum f[0-9][0-9] > SHA256SUMS)
size=$(unzip -Zl "${whl[0]}" sgl_kernel/flash_ops.abi3.so | awk '{print $4}')
printf '%s\n' "sgl_kernel/flash_ops.abi3.so of $(basename "${whl[0]}") ($size bytes)" > "$OUT/MANIFEST.txt"
pieces=("$OUT"/f[0-9][0-9])
echo "flash_ops.abi3.so: $size bytes; xz: $(cat "${pieces[@]}" | wc -c) bytes in ${#pieces[@]} pieces"
ls -l "$OUT"
