"""Check that the candidate serves what the config says before its answers are judged: the same
model on both arms, and each server's reported KV dtype the one configured (exit 2 unless
`--allow-mismatch`)."""

from __future__ import annotations

from dataclasses import replace

from kvqual.config import Target
from kvqual.errors import MismatchError
from kvqual.records import RunManifest


def verify(base: RunManifest, cand: RunManifest, allow_mismatch: bool) -> list[str]:
    """Refuse comparisons of the wrong thing (exit 2) unless --allow-mismatch; return warnings."""
    problems, warnings = [], []
    if base.model and cand.model and base.model != cand.model:
        problems.append(f"the arms serve different models: {base.model!r} vs {cand.model!r}")
    for m in (base, cand):
        reported = m.server_info.get("kv_cache_dtype")
        if m.kv_cache_dtype and reported and _norm(reported) != _norm(m.kv_cache_dtype):
            problems.append(f"{m.target} is configured with kv_cache_dtype {m.kv_cache_dtype!r} but the server "
                            f"reports {reported!r}")
        if m.kv_cache_dtype and not reported:
            warnings.append(f"{m.target}: the server does not report its KV dtype, so kv_cache_dtype "
                            f"{m.kv_cache_dtype!r} could not be verified")
        scale = (m.server_info.get("server_info") or {}).get("kv_scale")
        if reported and "fp8" in str(reported) and str(scale) == "1.0":
            warnings.append(f"{m.target} runs an fp8 KV cache with a default scale of 1.0 (no calibrated scales)")
    rb, rc = base.server_info.get("kv_cache_dtype"), cand.server_info.get("kv_cache_dtype")
    if (base.kv_cache_dtype and cand.kv_cache_dtype and _norm(base.kv_cache_dtype) != _norm(cand.kv_cache_dtype)
            and rb and rc and _norm(rb) == _norm(rc)):
        problems.append(f"both arms report KV dtype {rb!r} while the config says {base.kv_cache_dtype!r} vs "
                        f"{cand.kv_cache_dtype!r}")
    if problems and not allow_mismatch:
        raise MismatchError("; ".join(problems) + " (pass --allow-mismatch to compare anyway)")
    return warnings + [f"allowed mismatch: {p}" for p in problems]



async def as_reported(target: Target, like: RunManifest, timeout: float) -> RunManifest:
    """What `target` reports about itself, shaped as a manifest so `verify` can check it before a run
    (`timeout`: the run's, `probe.probe_timeout`)."""
    from kvqual import probe

    info = await probe.describe(target.base_url, target.api_key(), timeout=timeout)
    model = target.model or (info["models"][0] if info["models"] else None)
    return replace(like, target=target.name, model=model, kv_cache_dtype=target.kv_cache_dtype, server_info=info)



def _norm(dtype: str) -> str:
    d = dtype.lower()
    return {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
            "float8_e5m2": "fp8_e5m2", "f16": "fp16", "float16": "fp16", "half": "fp16"}.get(d, d)
