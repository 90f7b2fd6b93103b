"""The echo check: before its logprobs are used, a server scores its own greedy outputs, and its echo must
agree with what it reported while generating them (`check_echo_trust`, on the outputs `trust_sample` picks).
Pure over the samples and their forced records; forcing/teacher.py re-exports these names."""

from __future__ import annotations

from typing import Mapping

from kvqual.errors import EchoDisagreement
from kvqual.forced import Forced
from kvqual.records import Item, Sample

# nats. Echo re-scores the server's own greedy output in one prefill; with per-request fp8 scales
# calibrated on what is prefilled (prompt vs prompt + completion) the two legitimately differ:
# ~0.02 for fp8_e4m3 and 0.108 measured for fp8_e5m2 (2 mantissa bits) on the reference server.
# An echo shifted by one position or from another model is off by whole nats.
ECHO_TRUST_MAX_MEAN_ABS = 0.5
ECHO_TRUST_ITEMS = 3  # own outputs scored per API kind (chat, completions) before forcing


def _mean_abs(pairs: list[tuple[float, float]]) -> float | None:
    return sum(abs(g - e) for g, e in pairs) / len(pairs) if pairs else None


def _likely_cause(own: list[tuple[Sample, Forced]], mean: float) -> str:
    """What was observed, not a cause kvqual cannot know: an echo whose logprobs line up with the
    generation's one position over (a shifted echo), or scoring and generation that disagree on the
    same tokens — which a broken cache path and an echo that scores something else both produce, so
    on an fp8 candidate the message must not blame the thing under test."""
    shifted: dict[int, list[tuple[float, float]]] = {1: [], -1: []}
    tops: dict[int, list[tuple[float, float]]] = {0: [], 1: [], -1: []}  # the top-k, token by token
    for sample, forced in own:
        if not forced.aligned or forced.logprobs is None or sample.logprobs is None:
            continue
        g = [x for x in sample.logprobs.token_logprobs]
        e = [x for x in forced.logprobs.token_logprobs]
        for k in shifted:
            pairs = zip(g[k:], e) if k > 0 else zip(g, e[-k:])
            shifted[k] += [(a, b) for a, b in pairs if a is not None and b is not None]
        gt, et = list(sample.logprobs.top_logprobs), list(forced.logprobs.top_logprobs)
        for k in tops:
            for a, b in (zip(gt[k:], et) if k >= 0 else zip(gt, et[-k:])):
                tops[k] += [(a[t], b[t]) for t in (a.keys() & b.keys())] if a and b else []
    best = min(((_mean_abs(v), k) for k, v in shifted.items() if v), default=(None, 0))
    if best[0] is not None and best[0] < mean / 3 and best[0] <= ECHO_TRUST_MAX_MEAN_ABS:
        return f"echo looks shifted by one position (shifted, the gap is {best[0]:.3f} nats)"
    # a whole distribution one position over scores each token under its neighbour's distribution: the chosen
    # tokens' logprobs then match nowhere, but the top-k lists match one position over
    unshifted = _mean_abs(tops[0])
    top = min(((_mean_abs(v), k) for k, v in tops.items() if k and v), default=(None, 0))
    if top[0] is not None and unshifted is not None and top[0] < unshifted / 3 and top[0] <= ECHO_TRUST_MAX_MEAN_ABS:
        return (f"echo looks shifted by one position (its top-k logprobs match the generation's one position "
                f"over: a gap of {top[0]:.3f} nats shifted, {unshifted:.3f} in place)")
    return ("its scoring of a sequence (prefill) gives other logprobs than it reported while generating the "
            "same tokens (decode), and neither its chosen-token nor its top-k logprobs match one position over; "
            "kvqual cannot tell whether its echo or its "
            "cache path is at fault: check the echo on the baseline server too")


def check_echo_trust(own: list[tuple[Sample, Forced]], server: str) -> float | None:
    """Mean |echo − generation| logprob over a server's own greedy outputs; raise when off."""
    diffs = []
    for sample, forced in own:
        if not forced.aligned or forced.logprobs is None or sample.logprobs is None:
            continue
        for g, e in zip(sample.logprobs.token_logprobs, forced.logprobs.token_logprobs):
            if g is not None and e is not None:
                diffs.append(abs(g - e))
    if not diffs:
        return None
    mean = sum(diffs) / len(diffs)
    if mean > ECHO_TRUST_MAX_MEAN_ABS:
        cause = _likely_cause(own, mean)
        raise EchoDisagreement(
            f"{server}: echo logprobs of its own greedy output differ from the logprobs it reported while "
            f"generating (mean |Δ| {mean:.3f} nats > {ECHO_TRUST_MAX_MEAN_ABS}); observed: {cause}; "
            "teacher-forced metrics would be noise — fix the server or pass --no-teacher-forcing", mean, cause)
    return mean


def trust_sample(own: list[Sample], items: Mapping[tuple[str, str], Item], per_kind: int = ECHO_TRUST_ITEMS) -> list[Sample]:
    """The server's own outputs the echo check scores: `per_kind` of each API kind (chat and
    completions are rendered differently, so each path is checked on its own)."""
    picked: dict[str, list[Sample]] = {}
    for s in own:
        item = items.get((s.suite, s.id))
        if item is None or s.logprobs is None or not s.ok:
            continue
        bucket = picked.setdefault(item.api, [])
        if len(bucket) < per_kind:
            bucket.append(s)
    return [s for bucket in picked.values() for s in bucket]
