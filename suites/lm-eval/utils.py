"""Data loader for the kvqual_arith lm-eval task: the JSONL beside this file, no network."""

from pathlib import Path

import datasets


def load_docs(**kwargs) -> datasets.DatasetDict:
    """The task's docs as a DatasetDict with one `test` split (kwargs: lm-eval metadata)."""
    path = Path(__file__).with_name("kvqual_arith.jsonl")
    return datasets.DatasetDict({"test": datasets.Dataset.from_json(str(path))})
