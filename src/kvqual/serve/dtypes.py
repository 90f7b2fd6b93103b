"""KV cache dtype and fault names, without torch: the CLI parses `kvqual serve` flags (and
`kvqual --help` builds every parser) without importing the model stack (~2 s on this box)."""

from __future__ import annotations

from typing import Literal

KvCacheDtype = Literal["bf16", "fp8_e4m3", "fp8_e5m2"]
KvScale = Literal["dynamic", "1.0"]
KvFault = Literal["none", "ignore-scale-on-read", "drop-scale"]

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2")
KV_FAULTS: tuple[str, ...] = ("none", "ignore-scale-on-read", "drop-scale")
STORAGE_BYTES: dict[str, int] = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
FP8_NAMES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2")


def resolve_kv_cache_dtype(name: str) -> KvCacheDtype:
    """Map a CLI/SGLang name to the stored dtype: `auto` is bf16, `fp8` is e4m3 (as SGLang/vLLM)."""
    aliases = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3"}
    resolved = aliases.get(name, name)
    if resolved not in STORAGE_BYTES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return resolved  # type: ignore[return-value]


def check_kv_fault(kv_cache_dtype: KvCacheDtype, kv_fault: str) -> KvFault:
    """A known fault, and only with an fp8 dtype (a bf16 cache has no scale to lose)."""
    if kv_fault not in KV_FAULTS:
        raise ValueError(f"unknown kv fault {kv_fault!r}; choose one of {', '.join(KV_FAULTS)}")
    if kv_fault != "none" and kv_cache_dtype not in FP8_NAMES:
        raise ValueError(f"--kv-fault {kv_fault} needs an fp8 KV cache (--kv-cache-dtype fp8_e4m3 or fp8_e5m2), "
                         f"not {kv_cache_dtype}")
    return kv_fault  # type: ignore[return-value]
