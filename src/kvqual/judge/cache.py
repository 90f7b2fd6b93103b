"""The cache-path probe's evidence (docs/cache.md): warm against cold units of shared contexts, the
candidate's generated distributions against its own teacher-forced ones, minus the baseline's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from kvqual.gate import CachePairs
from kvqual.judge import positions as pos
from kvqual.judge.arms import Arm, Forcing, Key, clusters_of, usable
from kvqual.records import Sample

WARM_SHARE, COLD_SHARE = 0.5, 0.1  # cached share of the prompt: at least → warm, at most → cold

CACHE_PROBE_SUITES = frozenset({"shared_prefix"})  # suites built to probe the cache path (docs/cache.md)



def cache_state(s: Sample) -> bool | None:
    """Warm (True), cold (False) or neither (None) by the share of its prompt the server said it
    served from its prefix cache. Not "any hit": every prompt after the first shares the chat
    template's few blocks with every other (32 of ~1,000 tokens on the probe's), so a unit is warm
    when most of its prompt came from cache and cold when almost none did; between, it is left out."""
    if not s.ok or not s.context_id or s.cached_tokens is None:
        return None
    if not s.prompt_tokens:
        return s.cached_tokens > 0
    share = s.cached_tokens / s.prompt_tokens
    return True if share >= WARM_SHARE else False if share <= COLD_SHARE else None



def cache_states(samples: Mapping[Key, Sample]) -> dict[Key, bool]:
    """The answered units on shared contexts that were clearly warm (True) or cold (False)."""
    states = {k: cache_state(s) for k, s in samples.items()}
    return {k: v for k, v in states.items() if v is not None}



@dataclass(frozen=True)
class CacheEvidence:
    """The cache-path probe's per-unit comparisons (docs/cache.md): on each unit of a shared context
    the candidate reported as warm or cold, the mean KL between the candidate's teacher-forced (cold:
    echo never reads the cache) and generated (warm or cold) distributions over the outputs' common
    prefix, minus the same on the baseline."""

    warm: dict[Key, bool]  # the candidate's units: served from its cache or not
    cand_kl: dict[Key, float]  # KL(cand forced ‖ cand generated) over the common prefix
    base_kl: dict[Key, float]  # KL(base forced ‖ base generated) over the same positions
    exact: dict[Key, bool]  # the candidate's output equals the baseline's
    unpaired: str | None = None  # why no unit's generated and forced records could be compared, where none could



def cache_evidence(base: Arm, cand: Arm, keys: list[Key]) -> CacheEvidence | None:
    """The probe's comparisons over `keys`, or None where the candidate reported no warm unit (or the
    arms cannot read their generation top-k). Reads both arms' generation top-k once."""
    states = cache_states({k: cand.samples[k] for k in keys if k in cand.samples})
    if not any(states.values()) or base.topk is None or cand.topk is None or base.tokens is None or cand.tokens is None:
        return None
    upto: dict[Key, int] = {}
    exact: dict[Key, bool] = {}
    for k in states:
        b, c = base.samples.get(k), cand.samples[k]
        if b is None or not b.ok or k not in base.tokens.index or k not in cand.tokens.index:
            continue
        tb, tc = base.tokens.tokens_of(k), cand.tokens.tokens_of(k)
        d = pos.first_divergence(tb, tc)
        n = min(tb.size, tc.size)
        exact[k] = d is None
        upto[k] = n if d is None else min(d + 1, n)  # at the first differing token the contexts still agree
    base_top, cand_top = base.topk(), cand.topk()
    forced_b = {k: n for k, n in upto.items() if usable(base.forced, k)}
    forced_c = {k: n for k, n in upto.items() if usable(cand.forced, k)}
    base_kl = pos.kl_upto(base.forced.arrays, base_top, forced_b)
    cand_kl = pos.kl_upto(cand.forced.arrays, cand_top, forced_c)
    return CacheEvidence({k: states[k] for k in upto}, cand_kl, base_kl, exact,
                         None if not upto or (cand_kl and base_kl) else _unpaired(len(upto), cand_top, cand.forced))


def _unpaired(units: int, generated: pos.TokenArrays, forced: Forcing) -> str:
    """Why none of `units` could compare its generated and teacher-forced distributions."""
    gen_by, forced_by = ("by text" if a.names else "by id" for a in (generated, forced.arrays))
    if gen_by == forced_by:
        return (f"none of the {units} units could be compared (no generated and teacher-forced records with top-k "
                "on the same tokens)")
    return (f"none of the {units} units could be compared: the candidate's generated top-k name tokens {gen_by} "
            f"and its teacher-forced ones {forced_by} (SGLang's OpenAI endpoints give top-k logprobs as text, its "
            "native scoring as ids), so this server's cache path is not measured")



def cache_pairs(ev: CacheEvidence | None, base: Arm, cand: Arm, keys: list[Key]) -> CachePairs | None:
    """The gate's cache-path input over `keys`; None when the compare holds no probe (no warm unit
    reported and no probe suite)."""
    probe = any(k[0] in CACHE_PROBE_SUITES for k in keys)
    role = "primary" if probe else "guard"
    chosen = set(keys)
    if ev is None or not any(w for k, w in ev.warm.items() if k in chosen):
        if not probe:
            return None
        reported = any(cand.samples[k].cached_tokens is not None for k in keys if k in cand.samples)
        why = ("no request of the candidate was served from its prefix cache" if reported else
               "the candidate does not report cached prompt tokens (vLLM: --enable-prompt-tokens-details; "
               "SGLang: --enable-cache-report)")
        return CachePairs([], [], [], role=role, note=why)
    rows = [k for k in sorted(chosen) if k in ev.warm and k in ev.cand_kl and k in ev.base_kl]
    if not rows and ev.unpaired:
        return CachePairs([], [], [], role=role, note=ev.unpaired)
    warm = [ev.warm[k] for k in rows]
    n_warm, n_cold = sum(warm), len(warm) - sum(warm)
    exact_w = [ev.exact[k] for k in rows if ev.warm[k]]
    exact_c = [ev.exact[k] for k in rows if not ev.warm[k]]
    note = (f"{n_warm} warm and {n_cold} cold units; same output as the baseline: warm "
            f"{np.mean(exact_w):.0%}" if exact_w else f"{n_warm} warm and {n_cold} cold units")
    if exact_c:
        note += f", cold {np.mean(exact_c):.0%}"
    return CachePairs([ev.cand_kl[k] - ev.base_kl[k] for k in rows], warm,
                      clusters_of([cand.samples[k] for k in rows]), role=role, note=note)
