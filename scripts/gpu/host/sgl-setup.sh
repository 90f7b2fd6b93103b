#!/usr/bin/env bash
# On the GPU host, from the checkout: the SGLang bundle (bundle-sglang.sh). Check the staged pieces s00... ($ACC, put
# there by stage.sh) against their SHA256SUMS, join and unpack them to /tmp/s (sgl/ = SGLang 0.5.17's server tree,
# kvq/ = what kvqual lacks on the host, the GGUF), export the GGUF as an HF folder /tmp/s/model with kvqual's own
# exporter (`kvqual serve --export-hf`, as setup.sh does for vLLM: the same weights), then check once that SGLang
# imports from sgl/ (its transformers 5.12.1 and openai 2.6.1 ahead of the host's) and that every kvqual module
# imports from src/ + kvq/ (openai 3.x). The two trees never share a PYTHONPATH. Done steps are skipped.
# usage: bash scripts/gpu/host/sgl-setup.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
ACC=${ACC:-/tmp/acc} S=/tmp/s
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $S/.unpacked ]; then
  # only the sNN lines: a SHA256SUMS of the vLLM bundle (cNN) staged last means the SGLang pieces are not all here
  sums=$(grep -E '  s[0-9]{2}$' "$ACC/SHA256SUMS" 2> /dev/null) ||
    { echo "no SGLang pieces (sNN) in $ACC/SHA256SUMS: stage them first (stage.sh .gpu/sgl/sNN)"; exit 1; }
  (cd "$ACC" && sha256sum -c --quiet <<< "$sums") || { echo "pieces missing or damaged:"; ls -l "$ACC"; exit 1; }
  rm -rf $S/sgl $S/kvq && mkdir -p $S
  mapfile -t names < <(awk '{print $2}' <<< "$sums" | sort)
  (cd "$ACC" && cat "${names[@]}") | xz -dc -T0 | tar -xf - -C $S
  touch $S/.unpacked && (cd "$ACC" && rm -f "${names[@]}")
  echo "unpacked to $S: sgl/ $(du -sh $S/sgl | cut -f1), kvq/ $(du -sh $S/kvq | cut -f1)"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the exporter needs torch, transformers and safetensors (the host's) and gguf (kvq/)
[ -f $S/model/config.json ] || PYTHONPATH=$PWD/src:$S/kvq KVQUAL_CACHE_DIR=off \
  python3 -m kvqual.serve --model $S/$GGUF --export-hf $S/model
[ -f $S/.checked ] && exit 0
# SGLang: its package, its server's entry module (what launch_server imports before it forks: server args, HTTP
# server, tokenizer manager) and sgl_kernel, which loads sm90/common_ops on a compute-capability-9.0 GPU
PYTHONPATH=$S/sgl python3 - <<'PY'
import torch, sglang, transformers, openai, flashinfer
import sglang.launch_server, sglang.srt.entrypoints.http_server  # noqa: F401
import sgl_kernel
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU"
print("sgl/: sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__, "flashinfer", flashinfer.__version__,
      "transformers", transformers.__version__, "openai", openai.__version__, "torch", torch.__version__, gpu)
if not transformers.__version__.startswith("5.12."):  # the host's 5.17 would have shadowed the bundle's
    raise SystemExit(f"transformers {transformers.__version__} from {transformers.__file__}: expected the bundle's 5.12.1")
PY
PYTHONPATH=$PWD/src:$S/kvq python3 - <<'PY'
import importlib, pkgutil, openai, kvqual
bad = []
for m in pkgutil.walk_packages(kvqual.__path__, "kvqual."):  # what `kvqual compare` may load, all at once
    if not m.name.endswith("__main__"):
        try:
            importlib.import_module(m.name)
        except Exception as exc:  # noqa: BLE001 - listed, then the setup fails
            bad.append(f"{m.name}: {exc!r}")
print("kvq/: openai", openai.__version__, "; kvqual modules:", "all import" if not bad else "FAILED")
raise SystemExit("\n".join(bad) or None)
PY
touch $S/.checked
