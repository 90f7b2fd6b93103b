"""The report's examples: the most divergent pairs first, in an order that does not depend on the
order the answers finished in (samples.jsonl is written as requests complete)."""

from __future__ import annotations

import random

from kvqual.judge.metrics import examples
from kvqual.records import Sample


def _sample(i: int, text: str) -> Sample:
    return Sample(id=f"q{i:02d}", suite="s", repeat=0, text=text, finish_reason="stop", completion_tokens=4,
                  error=None)


def test_examples_are_the_same_whatever_order_the_answers_were_written_in() -> None:
    keys = [("s", f"q{i:02d}", 0) for i in range(20)]
    base = {k: _sample(i, "the same answer") for i, k in enumerate(keys)}
    cand = {k: _sample(i, "the same answer, longer") for i, k in enumerate(keys)}  # 20 ties
    want = examples(base, cand, limit=5)
    assert [e["id"] for e in want] == ["q00", "q01", "q02", "q03", "q04"]
    for seed in range(5):
        order = keys[:]
        random.Random(seed).shuffle(order)
        assert examples({k: base[k] for k in order}, {k: cand[k] for k in order}, limit=5) == want
