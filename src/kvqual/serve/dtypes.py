"""KV cache dtype, fault and cache-flag checks, without torch: the CLI parses `kvqual serve` flags
(and `kvqual --help` builds every parser) without importing the model stack (~2 s on this box)."""

from __future__ import annotations

from typing import Literal

KvCacheDtype = Literal["bf16", "fp8_e4m3", "fp8_e5m2"]
KvScale = Literal["dynamic", "1.0"]
KvFault = Literal["none", "ignore-scale-on-read", "drop-scale", "stale-cache-block"]

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2")
KV_FAULTS: tuple[str, ...] = ("none", "ignore-scale-on-read", "drop-scale", "stale-cache-block")
FP8_FAULTS: tuple[str, ...] = ("ignore-scale-on-read", "drop-scale")  # faults of the fp8 layers (kvcache.py)
PREFIX_CACHE_FAULTS: tuple[str, ...] = ("stale-cache-block",)  # faults of the prefix cache (prefixcache.py)
STORAGE_BYTES: dict[str, int] = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
FP8_NAMES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2")


def resolve_kv_cache_dtype(name: str) -> KvCacheDtype:
    """Map a CLI/SGLang name to the stored dtype: `auto` is bf16, `fp8` is e4m3 (as SGLang/vLLM)."""
    aliases = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3"}
    resolved = aliases.get(name, name)
    if resolved not in STORAGE_BYTES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return resolved  # type: ignore[return-value]


def check_kv_fault(kv_cache_dtype: KvCacheDtype, kv_fault: str, prefix_caching: bool = False) -> KvFault:
    """A known fault, with what it needs: an fp8 dtype for the scale faults (a bf16 cache has no
    scale to lose), prefix caching for `stale-cache-block` (any dtype)."""
    if kv_fault not in KV_FAULTS:
        raise ValueError(f"unknown kv fault {kv_fault!r}; choose one of {', '.join(KV_FAULTS)}")
    if kv_fault in FP8_FAULTS and kv_cache_dtype not in FP8_NAMES:
        raise ValueError(f"--kv-fault {kv_fault} needs an fp8 KV cache (--kv-cache-dtype fp8_e4m3 or fp8_e5m2), "
                         f"not {kv_cache_dtype}")
    if kv_fault in PREFIX_CACHE_FAULTS and not prefix_caching:
        raise ValueError(f"--kv-fault {kv_fault} needs prefix caching (--enable-prefix-caching or "
                         f"--enable-hierarchical-cache)")
    return kv_fault  # type: ignore[return-value]


def check_hicache(hicache_ratio: float, hicache_size_gb: float) -> None:
    """The host tier's size flags: a ratio above 0, a size in GB of 0 (use the ratio) or more."""
    if not hicache_ratio > 0:
        raise ValueError(f"--hicache-ratio must be above 0, not {hicache_ratio}")
    if not hicache_size_gb >= 0:
        raise ValueError(f"--hicache-size must be 0 (use --hicache-ratio) or more GB, not {hicache_size_gb}")
