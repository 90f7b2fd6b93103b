"""The tail of the teacher-forced comparison, per prompt: what a mean hides (report.json `tail`).

Beside every token mean the report shows the per-prompt distribution's upper end (p99 and the
maximum, as llama.cpp's perplexity tool prints 99.9% and max KLD) and the worst prompts by id with
the head of both outputs, so a person looking at a FAIL sees *which* prompts broke; and every
candidate answer that was not data (NaN logprobs), a broken prompt too (gate/tail.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from kvqual.judge.arms import Key, rounded
from kvqual.records import Sample

WORST = 8  # prompts listed, worst first
HEAD = 120  # characters of each output shown


def _head(text: str | None) -> str | None:
    return None if text is None else text[:HEAD]


def tail_summary(ab_means: Mapping[Key, tuple[float, float]], aa_means: Mapping[Key, tuple[float, float]],
                 keys: Sequence[Key], base: Mapping[Key, Sample], cand: Mapping[Key, Sample],
                 unusable: Mapping[Key, str], broken_kl: float) -> dict[str, Any] | None:
    """Per-prompt figures over the pairs of `keys` both servers scored: the mean KL(base‖cand) of each
    prompt and its share of tokens whose top-1 the servers agree on; p50/p99/max of the KL and of
    the top-1 disagreement; the prompts above `broken_kl`; the WORST prompts by KL with both
    outputs' heads; every unusable candidate answer (`unusable`: key → its error, from the generation
    or from teacher forcing on the candidate). None when nothing was scored."""
    scored = [k for k in keys if k in ab_means]
    if not scored and not unusable:
        return None
    kl = np.array([ab_means[k][0] for k in scored], float)
    miss = np.array([1 - ab_means[k][1] for k in scored], float)
    floor = {k: aa_means[k][0] for k in scored if k in aa_means}

    def q(values: np.ndarray, p: float) -> float | None:
        return rounded(float(np.quantile(values, p))) if values.size else None

    order = sorted(scored, key=lambda k: (-ab_means[k][0], k))[:WORST]
    worst = [{"suite": k[0], "id": k[1], "repeat": k[2], "kl": rounded(ab_means[k][0]),
              "kl_floor": rounded(floor.get(k)), "same_top1": rounded(ab_means[k][1]),
              "broken": ab_means[k][0] > broken_kl,
              "base_text": _head(base[k].text if k in base else None),
              "cand_text": _head(cand[k].text if k in cand else None)} for k in order]
    return {
        "prompts": len(scored), "broken_kl": broken_kl,
        "broken": int(np.sum(kl > broken_kl)) + len(unusable),
        "broken_floor": sum(1 for v in floor.values() if v > broken_kl),
        "kl": {"p50": q(kl, 0.5), "p99": q(kl, 0.99), "max": rounded(float(kl.max())) if kl.size else None},
        "top1_disagreement": {"p50": q(miss, 0.5), "p99": q(miss, 0.99),
                              "max": rounded(float(miss.max())) if miss.size else None},
        "worst": worst,
        "unusable": [{"suite": k[0], "id": k[1], "repeat": k[2], "error": unusable[k][:200]}
                     for k in sorted(unusable)[:50]],
        "unusable_count": len(unusable),
    }
