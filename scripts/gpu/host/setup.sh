#!/usr/bin/env bash
# On the GPU host: join the staged pieces (/tmp/acc) and unpack them to /tmp/g (site/ = vLLM 0.26.0 and the
# packages the host lacks; the GGUF), export the GGUF as an HF folder /tmp/g/model with kvqual's own
# exporter (`kvqual serve --export-hf`: the weights kvqual serve serves, architectures named, tied embeddings
# saved as model.embed_tokens), then check once that vLLM and every kvqual module import. Done steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ACC=${ACC:-/tmp/acc} G=/tmp/g
if [ ! -f $G/.unpacked ]; then
  [ -f "$ACC/SHA256SUMS" ] || { echo "no $ACC/SHA256SUMS: stage the pieces first (stage.sh)"; exit 1; }
  (cd "$ACC" && sha256sum -c --quiet SHA256SUMS) || { echo "pieces missing or damaged:"; ls -l "$ACC"; exit 1; }
  rm -rf $G/site && mkdir -p $G
  cat "$ACC"/c[0-9][0-9] | xz -dc -T0 | tar -xf - -C $G
  touch $G/.unpacked && rm -f "$ACC"/c[0-9][0-9]
  echo "unpacked to $G: $(du -sh $G/site | cut -f1)"
fi
export PYTHONPATH=$PWD/src:$G/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -f $G/model/config.json ] ||
  KVQUAL_CACHE_DIR=off python3 -m kvqual.serve --model $G/SmolLM2-135M-Instruct.Q4_1.gguf --export-hf $G/model
[ -f $G/.checked ] && exit 0
python3 - <<'PY'
import importlib, pkgutil, torch, transformers, vllm, kvqual
bad = []
for m in pkgutil.walk_packages(kvqual.__path__, "kvqual."):  # what `kvqual compare` may load, all at once
    if not m.name.endswith("__main__"):
        try:
            importlib.import_module(m.name)
        except Exception as exc:  # noqa: BLE001 - listed, then the setup fails
            bad.append(f"{m.name}: {exc!r}")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO GPU"
print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__, gpu,
      "; kvqual modules:", "all import" if not bad else "FAILED")
raise SystemExit("\n".join(bad) or None)
PY
touch $G/.checked
