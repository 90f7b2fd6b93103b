"""The KV cache of the reference server: K/V stored as bf16 or fp8, read back dequantized.

Every K/V that attention reads has been through the storage round trip, the prompt's own
prefill included. transformers' `Fp8QuantizedLayer` returns full-precision states on its
first update, so a single-pass prompt scoring (echo) would never see fp8; the layers here
fix that, which is what makes fp8 visible in prompt logprobs, as on a real engine. The
round trip is decoded once per position into a read-back buffer (a GPU kernel dequantizes
in registers instead); re-decoding the whole cache on every step made fp8 decode 2-3x slower
than bf16 here, which is an artefact, not a property of fp8.

Scales (fp8 only): `dynamic` calibrates one scale per (request, layer, K or V) on the
request's prompt (amax / dtype max) and freezes it; `1.0` uses no scale, so values past the
dtype's max saturate (like an engine that fell back to scale 1.0). One scale per request,
not per batch, keeps a request's numbers independent of what else is in the batch.

Faults (fp8 only, `--kv-fault`): reproductions of silent field failures of fp8 KV caches, for
testing that a quality gate catches them. The server still reports its fp8 dtype and scale
setting; only `kv_fault` in /get_server_info names the fault.
- `ignore-scale-on-read`: K/V are quantized with the calibrated scale on write, but read back
  without multiplying by it (a kernel that ignores the scale): attention sees x / scale, i.e.
  every K/V magnified by dtype max / amax (on SmolLM2-135M 448 / amax is ~15x to ~800x, median
  ~36x): gibberish from the first token (docs/serve.md, "Fault modes").
- `drop-scale`: the scale is lost and 1.0 used for writing and reading (an engine that fell back
  to 1.0 with only a warning), while the server still says `kv_scale` dynamic; values saturate
  at +-448 (e4m3) and those below half the smallest subnormal (2**-9 for e4m3) become 0. On
  SmolLM2-135M nearly harmless (|K/V| <= ~29 fits e4m3 at scale 1.0); models with outlier
  channels past 448 break.

The fault `stale-cache-block` is not a layer fault: it lives in the prefix cache's read path
(prefixcache.py) and works with bf16 as with fp8.

Layers also support the batch surgery continuous batching needs: rows join (left-padded to
the batch) and leave (with the common left padding trimmed), each at most one copy into
buffers with headroom, usually only of the rows that move. A prefix cache hit starts a layer
from stored K/V and their scales (`load`, `KvCache.load_prefix`), decoding the read-back copy
exactly as `update` does; `KvCache.stored_prefix` copies a prompt's stored blocks out.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from kvqual.serve.dtypes import (  # noqa: F401 - re-exported: the names live without torch in dtypes.py
    KV_CACHE_DTYPES,
    KV_FAULTS,
    STORAGE_BYTES,
    KvCacheDtype,
    KvFault,
    KvScale,
    check_kv_fault,
    resolve_kv_cache_dtype,
)

FP8_DTYPES: dict[str, torch.dtype] = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
SPARE_ROWS = 8  # rows a rebuilt batch keeps free, so that joining requests copy only themselves


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


class StoredLayer(DynamicLayer):
    """One layer's K/V as stored (bf16 or fp8) plus what attention reads back from them.

    Both live in buffers preallocated along the sequence (grown by doubling): `update` encodes
    only the new positions and decodes only those into the read-back copy, so a decode step costs
    O(new tokens), not a re-conversion of the whole cache. What attention reads is exactly the
    storage round trip (decode(encode(x)) is elementwise, so decoding once equals decoding on every
    read). Subclasses define the storage dtype and the encode/decode pair.
    """

    storage_dtype: torch.dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.compute_dtype = key_states.dtype
        self._len = 0
        self._nrows = key_states.shape[0]
        empty = key_states[..., :0, :]
        self._store = [empty.to(self.storage_dtype), empty.to(self.storage_dtype)]
        self._read = [empty.clone(), empty.clone()]
        self._per_row = self._first_states(key_states, value_states)

    def _first_states(self, key_states: torch.Tensor, value_states: torch.Tensor) -> list[torch.Tensor]:
        """Hook: per-row tensors ([B, ...]) a layer calibrates on the prompt (fp8 scales); they
        follow their rows through every join, leave and reorder."""
        return []

    def _encode(self, x: torch.Tensor, kv: int) -> torch.Tensor:
        raise NotImplementedError

    def _decode(self, q: torch.Tensor, kv: int) -> torch.Tensor:
        raise NotImplementedError

    def _reserve(self, length: int) -> None:
        """Make room for `length` positions (capacity at least doubles when it grows)."""
        cap = self._store[0].shape[-2]
        if length <= cap:
            return
        new_cap = max(length, 2 * cap)
        for bufs in (self._store, self._read):
            for i, buf in enumerate(bufs):
                shape = list(buf.shape)
                shape[-2] = new_cap
                grown = buf.new_empty(shape)  # positions past _len are never read
                grown[..., : self._len, :] = buf[..., : self._len, :]
                bufs[i] = grown

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self._read[0][: self._nrows, :, : self._len]
        self.values = self._read[1][: self._nrows, :, : self._len]
        return self.keys, self.values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store the new states and return every position's read-back K and V (the new ones too)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self._len + n)
        for kv, states in enumerate((key_states, value_states)):
            q = self._encode(states, kv)
            self._store[kv][: self._nrows, :, self._len : self._len + n] = q
            self._read[kv][: self._nrows, :, self._len : self._len + n] = self._decode(q, kv)
        self._len += n
        return self._views()

    def load(self, stored: tuple[torch.Tensor, torch.Tensor], per_row: list[torch.Tensor],
             compute_dtype: torch.dtype, capacity: int) -> None:
        """Start this empty layer from K/V already stored ([B, H, T, D] in the storage dtype: a prefix
        cache hit) and the per-row tensors they were stored with (fp8 scales, which later positions
        then use too). The read-back copy is decoded from them as `update` decodes (faults included)."""
        k, v = stored
        DynamicLayer.lazy_initialization(self, k, v)
        self.compute_dtype = compute_dtype
        self._nrows, self._len = k.shape[0], k.shape[-2]
        self._per_row = list(per_row)
        shape = (k.shape[0], k.shape[1], max(capacity, self._len), k.shape[3])
        self._store = [k.new_empty(shape), k.new_empty(shape)]
        self._read = [torch.empty(shape, dtype=compute_dtype, device=k.device) for _ in range(2)]
        for kv, q in enumerate(stored):
            self._store[kv][:, :, : self._len] = q
            self._read[kv][:, :, : self._len] = self._decode(q, kv)
        self._views()

    def per_row(self) -> list[torch.Tensor]:
        """The per-row tensors calibrated on the prompt (fp8: K and V scales, [B, 1, 1, 1]; bf16: none)."""
        return self._per_row

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored K and V, [B, H, T, D] in the storage dtype."""
        return self._store[0][: self._nrows, :, : self._len], self._store[1][: self._nrows, :, : self._len]

    def rows(self) -> int:
        """Batch rows in use (the buffers may hold spare rows for requests about to join)."""
        return self._nrows

    def compose(self, parts: list[tuple[StoredLayer, list[int] | None, int]], length: int) -> None:
        """Rebuild this layer from `parts` in one copy: for each (layer, rows or None for all, trim),
        those rows' positions [trim, end) right-aligned in `length` positions (zero left padding),
        stacked along the batch in order. The buffers keep headroom for the next decode steps."""
        # read every source (self may be one) before replacing anything
        plan = [(layer._store, layer._read, rows, trim, layer._len, layer.rows() if rows is None else len(rows))
                for layer, rows, trim in parts]
        n_rows = sum(p[-1] for p in plan)
        cap = length + max(32, length // 4)
        row_cap = n_rows + SPARE_ROWS
        rebuilt: list[list[torch.Tensor]] = [[], []]
        for which in range(2):  # 0: stored, 1: read back
            for kv in range(2):
                like = (self._store, self._read)[which][kv]
                new = like.new_empty((row_cap, like.shape[1], cap, like.shape[3]))
                row = 0
                for store, read, rows, trim, end, count in plan:
                    src = (store, read)[which][kv]
                    pad = length - (end - trim)
                    if pad:
                        new[row : row + count, :, :pad] = 0
                    if rows is None:
                        new[row : row + count, :, pad:length] = src[:count, :, trim:end]
                    else:
                        for j, r in enumerate(rows):
                            new[row + j, :, pad:length] = src[r, :, trim:end]
                    row += count
                rebuilt[which].append(new)
        self._store, self._read = rebuilt
        self._per_row = [torch.cat([layer._per_row[i] if rows is None else layer._per_row[i][rows]
                                    for layer, rows, _ in parts]) for i in range(len(self._per_row))]
        self._nrows = n_rows
        self._len = length
        self._views()

    def extend_rows(self, others: list[StoredLayer]) -> None:
        """Append other layers' rows after this one's, left-padding to the longest. Rows no longer
        than this layer's go into its spare rows (copying only them); otherwise one full rebuild."""
        count = sum(o.rows() for o in others)
        if all(o._len <= self._len for o in others) and self._nrows + count <= self._store[0].shape[0]:
            row = self._nrows
            for o in others:
                pad, n = self._len - o._len, o.rows()
                for mine, theirs in ((self._store, o._store), (self._read, o._read)):
                    for kv in range(2):
                        mine[kv][row : row + n, :, :pad] = 0
                        mine[kv][row : row + n, :, pad : self._len] = theirs[kv][:n, :, : o._len]
                row += n
            self._per_row = [torch.cat([t] + [o._per_row[i] for o in others]) for i, t in enumerate(self._per_row)]
            self._nrows = row
            self._views()
            return
        self.compose([(self, None, 0)] + [(o, None, 0) for o in others], max([self._len] + [o._len for o in others]))

    def retire(self, keep: list[int], trim: int) -> None:
        """Keep rows `keep` (in that order) and drop the first `trim` positions. Without a trim and
        with `keep` ascending, the kept rows move up in place (the rows after the first gap)."""
        if trim or any(b <= a for a, b in zip(keep, keep[1:])):
            self.compose([(self, list(keep), trim)], self._len - trim)
            return
        for j, r in enumerate(keep):
            if r != j:
                for bufs in (self._store, self._read):
                    for kv in range(2):
                        bufs[kv][j, :, : self._len] = bufs[kv][r, :, : self._len]
        self._per_row = [t[keep] for t in self._per_row]
        self._nrows = len(keep)
        self._views()

    def nbytes(self) -> int:
        """Bytes of the stored K and V at the used positions (the read-back copy is not counted:
        it stands in for the dequantization a GPU kernel does in registers)."""
        return 0 if not self.is_initialized else sum(b[: self._nrows, :, : self._len].nbytes for b in self._store)


class Bf16Layer(StoredLayer):
    """K/V stored as bfloat16, read back in the compute dtype."""

    storage_dtype = torch.bfloat16

    def _encode(self, x: torch.Tensor, kv: int) -> torch.Tensor:
        return x.to(self.storage_dtype)

    def _decode(self, q: torch.Tensor, kv: int) -> torch.Tensor:
        return q.to(self.compute_dtype)


class RoundTripFp8Layer(StoredLayer):
    """K/V stored as fp8 (e4m3fn or e5m2) with one scale per (batch row, K or V), prefill included.

    Unlike transformers' `Fp8QuantizedLayer`, the first update stores *and returns* the fp8 round
    trip; the scale is calibrated on the prompt (`dynamic`: amax / dtype max) or 1.0, then frozen;
    out-of-range values saturate instead of becoming NaN. `kv_fault` injects a field failure
    (see the module docstring).
    """

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn, kv_scale: KvScale = "dynamic",
                 kv_fault: KvFault = "none"):
        super().__init__()
        self.storage_dtype = fp8_dtype
        self.fp8_dtype = fp8_dtype
        self.kv_scale = kv_scale
        self.kv_fault = kv_fault

    def _scale_for(self, states: torch.Tensor) -> torch.Tensor:
        if self.kv_scale == "dynamic" and self.kv_fault != "drop-scale":
            return dynamic_scale(states, self.fp8_dtype)
        return torch.ones((states.shape[0], 1, 1, 1), dtype=torch.float32, device=states.device)

    def _first_states(self, key_states: torch.Tensor, value_states: torch.Tensor) -> list[torch.Tensor]:
        return [self._scale_for(key_states), self._scale_for(value_states)]

    def _encode(self, x: torch.Tensor, kv: int) -> torch.Tensor:
        return fp8_quantize(x, self.fp8_dtype, self._per_row[kv])

    def _decode(self, q: torch.Tensor, kv: int) -> torch.Tensor:
        if self.kv_fault == "ignore-scale-on-read":
            return q.to(self.compute_dtype)  # the stored fp8 values, never multiplied by the scale
        return fp8_dequantize(q, self._per_row[kv], self.compute_dtype)

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V scales, [B, 1, 1, 1] float32."""
        return self._per_row[0], self._per_row[1]


KvLayer = Bf16Layer | RoundTripFp8Layer


class KvCache(Cache):
    """A per-model cache of bf16 or fp8 layers, with the batch operations of continuous batching."""

    layers: list[KvLayer]

    def __init__(self, num_layers: int, kv_cache_dtype: KvCacheDtype, kv_scale: KvScale = "dynamic",
                 kv_fault: KvFault = "none"):
        check_kv_fault(kv_cache_dtype, kv_fault)
        if kv_cache_dtype == "bf16":
            layers: list[KvLayer] = [Bf16Layer() for _ in range(num_layers)]
        else:
            fp8 = FP8_DTYPES[kv_cache_dtype]
            layers = [RoundTripFp8Layer(fp8, kv_scale, kv_fault) for _ in range(num_layers)]
        super().__init__(layers=layers)
        self.kv_cache_dtype = kv_cache_dtype

    def length(self) -> int:
        """Stored positions per row (padding included)."""
        return self.layers[0].get_seq_length()

    def retire(self, keep: list[int], trim: int) -> None:
        """Keep only rows `keep` and drop the first `trim` positions."""
        for layer in self.layers:
            layer.retire(keep, trim)

    def extend_rows(self, *others: KvCache) -> None:
        """Append the rows of other caches (left-padding whichever are shorter), in one copy per buffer."""
        for i, layer in enumerate(self.layers):
            layer.extend_rows([o.layers[i] for o in others])

    def nbytes(self) -> int:
        """Bytes of stored K/V across layers (padding included: it is memory in use)."""
        return sum(layer.nbytes() for layer in self.layers)

    def stored_prefix(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A copy of row 0's first `tokens` stored positions, [layers, 2, H, tokens, D] in the storage
        dtype, and the scales they were stored with, [layers, 2] (None for bf16): a prefix cache entry."""
        kv = torch.stack([torch.stack([k[0, :, :tokens], v[0, :, :tokens]]) for k, v in
                          (layer.stored() for layer in self.layers)])
        if not self.layers[0].per_row():
            return kv, None
        return kv, torch.stack([torch.cat([t[0].reshape(1) for t in layer.per_row()]) for layer in self.layers])

    def load_prefix(self, kv: torch.Tensor, scales: torch.Tensor | None, compute_dtype: torch.dtype,
                    capacity: int) -> None:
        """Start this empty one-row cache from a prefix cache entry's K/V ([layers, 2, H, T, D]) and
        scales ([layers, 2]); `capacity`: positions to allocate (the whole prompt)."""
        for i, layer in enumerate(self.layers):
            per_row = [] if scales is None else [scales[i, j].reshape(1, 1, 1, 1) for j in range(2)]
            layer.load((kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0)), per_row, compute_dtype, capacity)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: KvCacheDtype) -> int:
    """Bytes one token's K and V take across all layers in this storage dtype."""
    return 2 * num_layers * num_kv_heads * head_dim * STORAGE_BYTES[kv_cache_dtype]


def kv_capacity_tokens(budget_bytes: int, bytes_per_token: int) -> int:
    """Tokens that fit in a fixed KV memory budget (SGLang's `max_total_num_tokens`)."""
    return budget_bytes // bytes_per_token
