#!/usr/bin/env bash
# On the GPU host, after sgl-setup.sh: put sgl_kernel's FA3 extension (the add-on of bundle-fa3.sh) into the
# bundle's sgl/ tree, so that `--attention-backend fa3` loads. The pieces f00... wait in $ACC (/tmp/acc-fa3, put
# there by `ACC=/tmp/acc-fa3 bash scripts/gpu/host/stage.sh .gpu/fa3/fNN`); each is checked against the carried
# SHA256SUMS, joined and unpacked, then `from sgl_kernel import flash_ops` is tried once on the GPU. Done: skipped.
# With PYTHON set (SGLang installed from its wheels on a box with network) there is nothing to do: the
# sglang-kernel wheel holds the extension.
# usage: bash scripts/gpu/host/sgl-fa3.sh
set -euo pipefail
[ -z "${PYTHON:-}" ] || exit 0
ACC=${ACC:-/tmp/acc-fa3} S=/tmp/s
SO=$S/sgl/sgl_kernel/flash_ops.abi3.so
[ -d $S/sgl/sgl_kernel ] || { echo "no $S/sgl/sgl_kernel: run sgl-setup.sh (or up-sgl.sh) first"; exit 1; }
if [ ! -f "$SO" ]; then
  sums=$(grep -E '  f[0-9]{2}$' "$ACC/SHA256SUMS" 2> /dev/null) ||
    { echo "no FA3 pieces (fNN) in $ACC/SHA256SUMS: stage them first (ACC=$ACC stage.sh .gpu/fa3/fNN)"; exit 1; }
  (cd "$ACC" && sha256sum -c --quiet <<< "$sums") || { echo "FA3 pieces missing or damaged:"; ls -l "$ACC"; exit 1; }
  mapfile -t names < <(awk '{print $2}' <<< "$sums" | sort)
  (cd "$ACC" && cat "${names[@]}") | xz -dc -T0 > "$SO.part"
  mv "$SO.part" "$SO" && (cd "$ACC" && rm -f "${names[@]}")
fi
PYTHONPATH=$S/sgl python3 -c "from sgl_kernel import flash_ops, flash_attn; print('fa3: sgl_kernel.flash_ops loads')"
