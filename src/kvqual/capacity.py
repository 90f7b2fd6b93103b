"""KV capacity that explains itself: what the KV dtype buys, and what the memory budget did.

A server's KV capacity in tokens is the memory it gave its KV cache divided by the bytes a token
takes there, and for one model the bytes a token takes scale with the bytes a value takes in the
KV dtype. So the capacity ratio of two arms splits exactly into two factors:

    capacity ratio = dtype share × memory share
    dtype share    = bytes a value (baseline dtype) / bytes a value (candidate dtype)   bf16 → fp8: 2
    memory share   = capacity ratio / dtype share = the ratio of the KV memory the servers gave

Only the dtype share is the candidate's doing. A memory share away from 1 is the servers' memory
budgets differing (other settings, or servers that sized their caches from the memory free when
they started, with others allocating beside them: three vLLM servers started together reported
40,912 and 2,889,904 tokens, "×70.6", of which fp8 explained ×2). Pure: from what the servers
reported (their dtypes and capacities; the KV memory itself where they report it: SGLang's
`memory_usage.kvcache`, vLLM's `kv_cache_memory_bytes` when set).
"""

from __future__ import annotations

from typing import Any, Mapping

# the share of the memory budget that counts as equal: block and page rounding, not a budget change
SAME_BUDGET = 0.02

_BYTES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "int8": 1.0, "bf16": 2.0, "bfloat16": 2.0,
          "fp16": 2.0, "float16": 2.0, "half": 2.0, "fp32": 4.0, "float32": 4.0, "float": 4.0}


def value_bytes(dtype: str | None) -> float | None:
    """Bytes one K or V value takes in a KV cache of `dtype` as servers name it; None when unknown
    (SGLang's and vLLM's "auto" is the model's dtype, which the server does not say)."""
    if not dtype:
        return None
    return _BYTES.get(str(dtype).strip().lower().replace("-", "_"))


def kv_dtype(configured: str | None, info: Mapping[str, Any]) -> str | None:
    """The KV dtype to size a token by: the configured or reported one, and for "auto" (the model's
    dtype) the model dtype the server reports where it does (SGLang's server args: `dtype`)."""
    si = info.get("server_info") or {}
    dtype = configured or info.get("kv_cache_dtype")
    if (not dtype or str(dtype).lower() == "auto") and isinstance(si, Mapping):
        model = si.get("dtype")
        return model if model and str(model).lower() != "auto" else dtype
    return dtype


def kv_memory_gib(info: Mapping[str, Any]) -> float | None:
    """The KV memory a server reports it gave its cache, in GiB (a probe's `server_info`), or None."""
    si = info.get("server_info") or {}
    states = si.get("internal_states") if isinstance(si, Mapping) else None
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping) else {}
    value = (first.get("memory_usage") or {}).get("kvcache") if isinstance(first, Mapping) else None
    if value is None and info.get("vllm_kv_cache_memory_bytes") is not None:
        value = float(info["vllm_kv_cache_memory_bytes"]) / 2**30
    try:
        return None if value is None else round(float(value), 4)
    except (TypeError, ValueError):
        return None


def split(base_tokens: int | None, base_dtype: str | None, cand_tokens: int | None, cand_dtype: str | None,
          base_gib: float | None = None, cand_gib: float | None = None) -> dict[str, Any] | None:
    """Both arms' capacities, their ratio, and its dtype and memory shares (None where the dtypes
    are unknown); None when neither server reports a capacity."""
    if base_tokens is None and cand_tokens is None:
        return None
    ratio = cand_tokens / base_tokens if base_tokens and cand_tokens else None
    vb, vc = value_bytes(base_dtype), value_bytes(cand_dtype)
    dtype_share = vb / vc if vb and vc else None
    memory_share = ratio / dtype_share if ratio is not None and dtype_share else None
    return {"baseline": base_tokens, "candidate": cand_tokens, "ratio": _r(ratio),
            "dtypes": {"baseline": base_dtype, "candidate": cand_dtype},
            "dtype_share": _r(dtype_share), "memory_share": _r(memory_share),
            "kv_memory_gib": ({"baseline": base_gib, "candidate": cand_gib}
                              if base_gib is not None or cand_gib is not None else None),
            "same_budget": None if memory_share is None else abs(memory_share - 1) <= SAME_BUDGET}


def sentence(cap: Mapping[str, Any]) -> str | None:
    """'KV capacity: 32,000 tokens → 64,000 tokens (×2: the KV dtype, bf16 → fp8_e4m3, 2 → 1 bytes a value)',
    or, when the budgets differ, the split that keeps the dtype from being credited with it."""
    b, c, r = cap.get("baseline"), cap.get("candidate"), cap.get("ratio")
    if b is None and c is None:
        return None
    tok = lambda v: "not reported" if v is None else f"{int(v):,} tokens"  # noqa: E731
    head = f"KV capacity: {tok(b)} → {tok(c)}"
    if r is None:
        return head
    d, m = cap.get("dtype_share"), cap.get("memory_share")
    dt = cap.get("dtypes") or {}
    if d is None or m is None:
        return f"{head} (×{r:.3g}; the KV dtypes' sizes are unknown, so how much of it is the dtype is not known)"
    what = (f"{dt.get('baseline')} → {dt.get('candidate')}, {_n(value_bytes(dt.get('baseline')))} → "
            f"{_n(value_bytes(dt.get('candidate')))} bytes a value")
    if cap.get("same_budget"):
        if d == 1:
            return f"{head} (the same KV dtype, {dt.get('baseline')}, and the same KV memory)"
        return f"{head} (×{r:.3g}: the KV dtype, {what})"
    gib = cap.get("kv_memory_gib") or {}
    mem = "" if not gib else (f", {_gib(gib.get('baseline'))} → {_gib(gib.get('candidate'))} as the servers report")
    return (f"{head} (×{r:.3g}): the KV dtype explains ×{d:.3g} ({what}); the other ×{m:.3g} is the memory the "
            f"servers gave their KV caches{mem} — a difference of budgets, not of the dtype (compare capacities "
            "of servers given the same KV memory: vLLM --kv-cache-memory-bytes, SGLang --max-total-tokens)")


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _gib(x: float | None) -> str:
    return "not reported" if x is None else f"{x:.3g} GiB"
