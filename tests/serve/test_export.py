"""The exported HF folder as other engines read it (`kvqual serve --export-hf`)."""

import json

from kvqual.serve.model import _bound_model_max_length


def test_the_tokenizer_gets_the_models_context_length_not_transformers_no_limit(tmp_path):
    """A GGUF's tokenizer has no model_max_length, so transformers writes 10**30; SGLang 0.5.17's
    /tokenize answers it as max_model_len and fails to encode it (HTTP 500 on every call, seen on an
    H100): the export writes the model's context length instead, and leaves a real limit alone."""
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"model_max_length": 10**30, "eos_token": "<|im_end|>"}))
    _bound_model_max_length(path, {"max_position_embeddings": 8192})
    assert json.loads(path.read_text()) == {"model_max_length": 8192, "eos_token": "<|im_end|>"}
    path.write_text(json.dumps({"model_max_length": 2048}))
    _bound_model_max_length(path, {"max_position_embeddings": 8192})
    assert json.loads(path.read_text())["model_max_length"] == 2048
