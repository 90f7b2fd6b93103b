"""A pair scored in different windows on the two servers (their prompt limits differ) is not
compared: its tokens saw different context. It is left out with that reason."""

from kvqual.compare import metrics as mx
from kvqual.compare.teacher import Forced
from kvqual.records import TokenLogprobs

LP = TokenLogprobs(tokens=("a", "b", "c", "d"), token_logprobs=(-0.1, -0.2, -0.3, -0.4),
                   top_logprobs=({"a": -0.1, "x": -2.0}, {"b": -0.2, "y": -1.9}, {"c": -0.3, "z": -1.5},
                                 {"d": -0.4, "w": -1.2}))
WINDOWS = {"max_prompt": 160, "windows": [[0, 0, 2], [1, 2, 4]]}


def _forcing(chunks_by_id: dict) -> mx.Forcing:
    return mx.Forcing({("s", i, 0): Forced("s", i, 0, True, None, LP, "ids", chunks) for i, chunks in chunks_by_id.items()})


def test_only_pairs_scored_in_the_same_windows_are_compared() -> None:
    base = _forcing({"one": None, "both": WINDOWS, "mixed": None})
    cand = _forcing({"one": None, "both": WINDOWS, "mixed": WINDOWS})
    keys = [("s", "one", 0), ("s", "both", 0), ("s", "mixed", 0)]
    assert [mx.same_windows(base, cand, k) for k in keys] == [True, True, False]
    pp = mx.forced_pairs(base, cand, keys)
    assert sorted(pp.keys) == [("s", "both", 0), ("s", "one", 0)]
    assert float(pp.kl.max()) == 0.0  # the same scores: compared like for like
