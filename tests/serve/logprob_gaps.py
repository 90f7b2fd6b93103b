"""Comparing the real model's logprobs in a way that holds on every x86-64 CPU.

Float32 results on CPU depend on the kernels: the same prompt scored with another matrix shape
(a warm suffix prefill, one decode step, a padded batch) rounds differently, and how differently
depends on the instruction set (AVX-512/AMX, AVX2, none) and on the BLAS's code path for the
vendor. bf16 and fp8 K/V storage turn some of those last-bit differences into visible logprob
changes, and greedy decoding turns a change at a near-tie into another output. A fixed threshold
on one token's |Δ logprob| (say 0.1 nats) therefore passes on one CPU and fails on another
(issue 37: 0.139 against 0.1 on a Zen 5 EPYC, the same test passing on this project's Xeon; on
the Xeon with its kernels limited to SSE4.2, below: 0.113).

So the tests of tests/serve/ measure their yardstick in the same test, on the same machine:
fp8's own rounding noise, i.e. the mean |Δ logprob| between an fp8 KV cache and a bf16 one on
the same requests, averaged over many tokens (never one). Two kinds of claims are made against it:

- a path meant to be the *same computation* (bf16 warm against cold, a prefill against decode
  steps, a batch against one request) changes logprobs by at most SAME_PATH_SHARE of that noise
  on average (measured: at most 1/23 of it, over five such tests and three kernel sets; the same
  paths with fp8-precision K/V written on part of them: 0.37-1.04 of it); its greedy output may part
  from the reference only at a near-tie, a position where the reference's top-1 leads its
  top-2 by less than that noise;
- an *fp8 computation with other scales* (a warm hit that adopts another prompt's scales) is at
  most FP8_PAIR_FACTOR times the noise away from a cold fp8 run: each of the two is one fp8
  rounding away from bf16, so by the triangle inequality their mean distance is at most the sum
  of theirs, i.e. about twice the noise (measured: 0.76-0.97 times it; a warm hit that reads stale
  blocks, or decodes the cached bytes with scales off by 1.25x: 4.8-5.8 times it).

Kernel sets measured (this Xeon, 2026-12-04): the default (AVX-512 + AMX), and with
MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, and with
MKL_ENABLE_INSTRUCTIONS=SSE4_2 ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

SAME_PATH_SHARE = 0.25
FP8_PAIR_FACTOR = 2.0


@dataclass(frozen=True)
class Run:
    """One greedy completion: the token ids, each one's logprob, and each position's top-2."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[str, float], ...]

    @classmethod
    def of(cls, response: dict) -> "Run":
        """From a /v1/completions response asked with `logprobs` ≥ 2 and `return_tokens_as_token_ids`."""
        lp = response["choices"][0]["logprobs"]
        ids = tuple(int(t.split(":", 1)[1]) for t in lp["tokens"])
        return cls(ids, tuple(lp["token_logprobs"]), tuple(lp["top_logprobs"]))

    def margin(self, i: int) -> float:
        """How far position i's top-1 leads its top-2 (nats; infinite when only one is listed)."""
        best = sorted(self.top[i].values(), reverse=True)
        return best[0] - best[1] if len(best) > 1 else float("inf")


def parted_at(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two token sequences differ (the shorter length when neither does)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def gaps(runs: Iterable[Run], refs: Iterable[Run]) -> list[float]:
    """|Δ logprob| of the token each greedy run chose, position by position, up to and including the
    first position where the two part (both chose their top-1 from the same context there; after it
    the contexts differ and the logprobs are not comparable); every pair pooled."""
    out: list[float] = []
    for run, ref in zip(runs, refs, strict=True):
        upto = min(parted_at(run.ids, ref.ids) + 1, len(run.ids), len(ref.ids))
        out.extend(abs(run.logprobs[i] - ref.logprobs[i]) for i in range(upto))
    return out


def mean_gap(runs: Iterable[Run], refs: Iterable[Run]) -> float:
    g = gaps(runs, refs)
    assert g, "no token to compare"
    return sum(g) / len(g)


def token_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """Mean |Δ logprob| of two scorings of the same tokens (teacher forcing: no divergence to stop at)."""
    assert len(a) == len(b) and a, (len(a), len(b))
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def parts_only_at_near_ties(runs: Sequence[Run], refs: Sequence[Run], tie: float) -> list[str]:
    """Where a run's greedy output parts from its reference's at a position whose reference top-1
    leads its top-2 by `tie` nats or more, and a near-tie earlier does not excuse it: one line each
    (an empty list when every run equals its reference or parts only at a near-tie)."""
    bad = []
    for k, (run, ref) in enumerate(zip(runs, refs, strict=True)):
        at = parted_at(run.ids, ref.ids)
        if at == len(run.ids) == len(ref.ids):
            continue
        ties = [i for i in range(min(at + 1, len(ref.ids))) if ref.margin(i) < tie]
        if not ties:
            margin = ref.margin(at) if at < len(ref.ids) else float("nan")
            bad.append(f"#{k} parts at token {at} where the reference leads by {margin:.3f} nats (near-tie: < {tie:.3f})")
    return bad
