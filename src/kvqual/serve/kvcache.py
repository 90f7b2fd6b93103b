"""The KV cache of the reference server: K/V stored as bf16 or fp8, read back dequantized.

Every K/V that attention reads has been through the storage round trip, the prompt's own
prefill included. transformers' `Fp8QuantizedLayer` returns full-precision states on its
first update, so a single-pass prompt scoring (echo) would never see fp8; the layers here
fix that, which is what makes fp8 visible in prompt logprobs, as on a real engine.

Scales (fp8 only): `dynamic` calibrates one scale per (request, layer, K or V) on the
request's prompt (amax / dtype max) and freezes it; `1.0` uses no scale, so values past the
dtype's max saturate (like an engine that fell back to scale 1.0). One scale per request,
not per batch, keeps a request's numbers independent of what else is in the batch.

Layers also support the batch surgery continuous batching needs: left-pad, concatenate
along the batch, select rows, trim the common left padding.
"""

from __future__ import annotations

from typing import Literal

import torch
from transformers.cache_utils import Cache, DynamicLayer, Fp8QuantizedLayer

KvCacheDtype = Literal["bf16", "fp8_e4m3", "fp8_e5m2"]
KvScale = Literal["dynamic", "1.0"]

KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2")
FP8_DTYPES: dict[str, torch.dtype] = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
STORAGE_BYTES: dict[str, int] = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def resolve_kv_cache_dtype(name: str) -> KvCacheDtype:
    """Map a CLI/SGLang name to the stored dtype: `auto` is bf16, `fp8` is e4m3 (as SGLang/vLLM)."""
    aliases = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3"}
    resolved = aliases.get(name, name)
    if resolved not in STORAGE_BYTES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return resolved  # type: ignore[return-value]


def fp8_quantize(x: torch.Tensor, fp8_dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, saturated to the fp8 range (a plain cast would turn overflow into NaN)."""
    fmax = torch.finfo(fp8_dtype).max
    return (x.float() / scale).clamp(-fmax, fmax).to(fp8_dtype)


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The value attention reads back: q * scale in the compute dtype."""
    return (q.float() * scale).to(dtype)


def dynamic_scale(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """One scale per batch row, amax / dtype max, shaped [B, 1, 1, 1] (never zero)."""
    amax = x.detach().abs().float().amax(dim=(1, 2, 3), keepdim=True)
    return (amax / torch.finfo(fp8_dtype).max).clamp(min=torch.finfo(torch.float32).tiny)


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Prepend n zero positions on the sequence axis (-2)."""
    if n == 0:
        return t
    shape = list(t.shape)
    shape[-2] = n
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=-2)


class Bf16Layer(DynamicLayer):
    """A DynamicLayer that stores K/V as bfloat16 and returns them in the compute dtype."""

    storage_dtype = torch.bfloat16

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append the new states (stored as bf16) and return the whole cache, upcast."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.compute_dtype = key_states.dtype
            self.keys = self.keys.to(self.storage_dtype)
            self.values = self.values.to(self.storage_dtype)
        self.keys = torch.cat([self.keys, key_states.to(self.storage_dtype)], dim=-2)
        self.values = torch.cat([self.values, value_states.to(self.storage_dtype)], dim=-2)
        return self.keys.to(self.compute_dtype), self.values.to(self.compute_dtype)

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored K and V tensors, [B, H, T, D]."""
        return self.keys, self.values

    def pad_left(self, n: int) -> None:
        """Prepend n (masked) positions."""
        self.keys, self.values = _pad_left(self.keys, n), _pad_left(self.values, n)

    def trim_left(self, n: int) -> None:
        """Drop the first n positions (padding common to every row)."""
        self.keys, self.values = self.keys[..., n:, :], self.values[..., n:, :]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows."""
        self.keys, self.values = self.keys[rows], self.values[rows]

    def extend_rows(self, other: Bf16Layer) -> None:
        """Append another layer's rows (same sequence length) after this one's."""
        self.keys = torch.cat([self.keys, other.keys], dim=0)
        self.values = torch.cat([self.values, other.values], dim=0)

    def nbytes(self) -> int:
        """Bytes held by the stored K and V."""
        return 0 if not self.is_initialized else self.keys.nbytes + self.values.nbytes


class RoundTripFp8Layer(Fp8QuantizedLayer):
    """transformers' Fp8QuantizedLayer, made to quantize every K/V it returns, prefill included.

    Differences from the parent: the first update stores *and returns* the fp8 round trip;
    the fp8 dtype (e4m3fn or e5m2) and the scale mode are chosen; scales are per batch row;
    out-of-range values saturate.
    """

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn, kv_scale: KvScale = "dynamic"):
        super().__init__()
        self.fp8_dtype = fp8_dtype
        self.fp8_max = torch.finfo(fp8_dtype).max
        self.kv_scale = kv_scale

    def _scale_for(self, states: torch.Tensor) -> torch.Tensor:
        if self.kv_scale == "dynamic":
            return dynamic_scale(states, self.fp8_dtype)
        return torch.ones((states.shape[0], 1, 1, 1), dtype=torch.float32, device=states.device)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        DynamicLayer.lazy_initialization(self, key_states, value_states)
        empty = key_states[..., :0, :]
        self._quantized_keys = (empty.to(self.fp8_dtype), self._scale_for(key_states))
        self._quantized_values = (empty.to(self.fp8_dtype), self._scale_for(value_states))

    def _quantize(self, tensor, scale=None):
        if scale is None:
            scale = self._scale_for(tensor)
        return fp8_quantize(tensor, self.fp8_dtype, scale), scale

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store the new states as fp8 and return the dequantized cache (the new states too)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        qk, k_scale = self._quantized_keys
        qv, v_scale = self._quantized_values
        new_k, _ = self._quantize(key_states, k_scale)
        new_v, _ = self._quantize(value_states, v_scale)
        self._quantized_keys = (torch.cat([qk, new_k], dim=-2), k_scale)
        self._quantized_values = (torch.cat([qv, new_v], dim=-2), v_scale)
        return self._dequantize(self._quantized_keys), self._dequantize(self._quantized_values)

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored fp8 K and V tensors, [B, H, T, D]."""
        return self._quantized_keys[0], self._quantized_values[0]

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V scales, [B, 1, 1, 1] float32."""
        return self._quantized_keys[1], self._quantized_values[1]

    def pad_left(self, n: int) -> None:
        """Prepend n (masked) positions."""
        (qk, sk), (qv, sv) = self._quantized_keys, self._quantized_values
        self._quantized_keys, self._quantized_values = (_pad_left(qk, n), sk), (_pad_left(qv, n), sv)
        self.cumulative_length += n

    def trim_left(self, n: int) -> None:
        """Drop the first n positions (padding common to every row)."""
        (qk, sk), (qv, sv) = self._quantized_keys, self._quantized_values
        self._quantized_keys, self._quantized_values = (qk[..., n:, :], sk), (qv[..., n:, :], sv)
        self.cumulative_length -= n

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (with their scales)."""
        (qk, sk), (qv, sv) = self._quantized_keys, self._quantized_values
        self._quantized_keys, self._quantized_values = (qk[rows], sk[rows]), (qv[rows], sv[rows])

    def extend_rows(self, other: RoundTripFp8Layer) -> None:
        """Append another layer's rows (same sequence length) after this one's."""
        (qk, sk), (qv, sv) = self._quantized_keys, self._quantized_values
        (ok, osk), (ov, osv) = other._quantized_keys, other._quantized_values
        self._quantized_keys = (torch.cat([qk, ok]), torch.cat([sk, osk]))
        self._quantized_values = (torch.cat([qv, ov]), torch.cat([sv, osv]))

    def nbytes(self) -> int:
        """Bytes held by the stored fp8 K and V (scales are negligible and left out)."""
        if not self.is_initialized:
            return 0
        return self._quantized_keys[0].nbytes + self._quantized_values[0].nbytes


KvLayer = Bf16Layer | RoundTripFp8Layer


class KvCache(Cache):
    """A per-model cache of bf16 or fp8 layers, with the batch operations of continuous batching."""

    layers: list[KvLayer]

    def __init__(self, num_layers: int, kv_cache_dtype: KvCacheDtype, kv_scale: KvScale = "dynamic"):
        if kv_cache_dtype == "bf16":
            layers: list[KvLayer] = [Bf16Layer() for _ in range(num_layers)]
        else:
            fp8 = FP8_DTYPES[kv_cache_dtype]
            layers = [RoundTripFp8Layer(fp8, kv_scale) for _ in range(num_layers)]
        super().__init__(layers=layers)
        self.kv_cache_dtype = kv_cache_dtype

    def length(self) -> int:
        """Stored positions per row (padding included)."""
        return self.layers[0].get_seq_length()

    def pad_left(self, n: int) -> None:
        """Prepend n masked positions to every row of every layer."""
        for layer in self.layers:
            layer.pad_left(n)

    def trim_left(self, n: int) -> None:
        """Drop the first n positions of every layer."""
        if n > 0:
            for layer in self.layers:
                layer.trim_left(n)

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows, in this order."""
        index = torch.tensor(rows, dtype=torch.long)
        for layer in self.layers:
            layer.select_rows(index)

    def extend_rows(self, other: KvCache) -> None:
        """Append the rows of another cache, left-padding whichever is shorter."""
        mine, theirs = self.length(), other.length()
        self.pad_left(max(0, theirs - mine))
        other.pad_left(max(0, mine - theirs))
        for layer, other_layer in zip(self.layers, other.layers):
            layer.extend_rows(other_layer)  # type: ignore[arg-type]

    def nbytes(self) -> int:
        """Bytes of stored K/V across layers (padding included: it is memory in use)."""
        return sum(layer.nbytes() for layer in self.layers)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: KvCacheDtype) -> int:
    """Bytes one token's K and V take across all layers in this storage dtype."""
    return 2 * num_layers * num_kv_heads * head_dim * STORAGE_BYTES[kv_cache_dtype]


def kv_capacity_tokens(budget_bytes: int, bytes_per_token: int) -> int:
    """Tokens that fit in a fixed KV memory budget (SGLang's `max_total_num_tokens`)."""
    return budget_bytes // bytes_per_token
