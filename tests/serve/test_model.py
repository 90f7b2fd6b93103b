"""Loading the default model: the GGUF's one-time conversion is cached and loads back identical."""

import logging

import pytest
import torch

from kvqual.serve.model import converted_folder, load_model, resolve_source

SAMPLE = "The pass key is 12345. <|im_start|>user\nhéllo 日本語<|im_end|>"


def test_gguf_conversion_is_cached_and_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("KVQUAL_CACHE_DIR", str(tmp_path))
    source = resolve_source(None)
    folder = converted_folder(source, "float32")
    assert folder is not None and folder.parent == tmp_path / "models"
    first = load_model.__wrapped__(source)  # from the GGUF, and writes the conversion
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp folder left behind
    again = load_model.__wrapped__(source)  # from the cache
    assert again.model.name_or_path == str(folder)
    a, b = first.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.model.lm_head.weight.data_ptr() == again.model.model.embed_tokens.weight.data_ptr()
    assert first.tokenizer(SAMPLE)["input_ids"] == again.tokenizer(SAMPLE)["input_ids"]
    assert first.tokenizer.chat_template == again.tokenizer.chat_template
    assert again.source.path.endswith(".gguf")  # what the server reports is still the GGUF file
    assert (again.num_layers, again.num_kv_heads, again.head_dim) == (first.num_layers, first.num_kv_heads, first.head_dim)


def test_cache_can_be_turned_off_and_a_bad_folder_only_warns(tmp_path, monkeypatch, caplog):
    source = resolve_source(None)
    monkeypatch.setenv("KVQUAL_CACHE_DIR", "off")
    assert converted_folder(source, "float32") is None
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("KVQUAL_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, logger="kvqual.serve.model"):
        loaded = load_model.__wrapped__(source)
    assert loaded.num_layers == 30
    assert "could not cache the converted model" in caplog.text
