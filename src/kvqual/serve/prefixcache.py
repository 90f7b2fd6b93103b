"""The prefix cache of the reference server (off by default): K/V of past prompts' full 16-token
blocks, reused by later prompts that start with the same tokens; optionally a host tier behind it.

Keys are vLLM's hash chain: block i's key = sha256(key of block i-1, its 16 token ids, and for
block 0 the request's `cache_salt` if any), so a key names a whole prefix and requests with
different salts never share a block. A lookup finds the longest chain of cached full blocks,
capped so that at least the prompt's last token is computed (its logits pick the first output).

An entry is one prompt's full blocks as stored (`CachedPrefix`: K/V [layers, 2, heads, tokens,
head_dim] in the storage dtype, bf16 or fp8 values, plus the fp8 scales they were quantized
with). A hit is served from one entry, so a warm fp8 request adopts that entry's scales. An
entry whose blocks are a prefix of a newer one's is dropped when the newer one is inserted
(multi-turn chat keeps one entry per conversation); otherwise entries do not share storage
(a radix tree would store a shared prefix once; this store counts it once per entry).

Capacity: the engine calls `fit(room)` with the KV budget left after running requests'
reservations (SGLang's radix cache shares the pool the same way); least recently used entries
are evicted. With a host tier (SGLang's `--enable-hierarchical-cache`) an evicted entry is
copied out as raw bytes plus the dtype, shape and scales needed to view them back
(`HostCopy`), LRU-dropped when the tier is full; a lookup whose best match lives only there
loads it back to the device store and serves from it.

Fault `stale-cache-block` (`stale_blocks=True`): on a hit, every matched block after the first
is served from a stale slot, the same block index of the least recently used *other* device
entry (zeros where that entry has no such block, or when there is none), as a block table
that points at slots reused without invalidation. Cold requests never read, so they are
untouched.

    PrefixCache
      lookup(keys, prompt_tokens) -> PrefixHit | None   (counts queries, hits, host hits)
      insert(keys, kv, scales)                           (after a prefill)
      fit(room, keep=None)                               (evict LRU down to `room` tokens)
      flush()                                            (both tiers)
"""

from __future__ import annotations

import array
import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

BLOCK_SIZE = 16  # tokens per cached block (vLLM's default block size)


def block_keys(token_ids: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
    """The hash-chain key of every full block of `token_ids` (a trailing partial block has none)."""
    count = len(token_ids) // BLOCK_SIZE
    raw = array.array("q", token_ids[: count * BLOCK_SIZE]).tobytes()
    width = BLOCK_SIZE * 8
    keys: list[bytes] = []
    parent = b""
    for i in range(count):
        h = hashlib.sha256(parent)
        h.update(raw[i * width : (i + 1) * width])
        if i == 0 and cache_salt is not None:
            h.update(b"\0cache_salt\0" + cache_salt.encode("utf-8"))
        parent = h.digest()
        keys.append(parent)
    return keys


def host_capacity_tokens(device_tokens: int, bytes_per_token: int, hicache_size_gb: float,
                         hicache_ratio: float) -> int:
    """Tokens the host tier holds: `hicache_size_gb` * 1e9 bytes when set, else `hicache_ratio` x the
    device pool (SGLang's HostKVCache sizing)."""
    if hicache_size_gb > 0:
        return int(hicache_size_gb * 1e9 // bytes_per_token)
    return int(device_tokens * hicache_ratio)


@dataclass(frozen=True)
class CachedPrefix:
    """One cached prompt's full blocks on device: `kv` [layers, 2, heads, tokens, head_dim] in the
    storage dtype, `scales` [layers, 2] float32 (fp8: the K and V scales they were quantized with)."""

    keys: tuple[bytes, ...]
    kv: torch.Tensor
    scales: torch.Tensor | None

    @property
    def tokens(self) -> int:
        return len(self.keys) * BLOCK_SIZE


@dataclass(frozen=True)
class HostCopy:
    """An entry in the host tier: the raw bytes of its tensors and what is needed to view them back."""

    keys: tuple[bytes, ...]
    data: bytes
    dtype: str
    shape: tuple[int, ...]
    scales: bytes | None

    @property
    def tokens(self) -> int:
        return len(self.keys) * BLOCK_SIZE


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _viewed(data: bytes, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(tuple(shape))


def to_host(entry: CachedPrefix) -> HostCopy:
    """Copy an entry out as bytes (what a device-to-host transfer moves)."""
    scales = None if entry.scales is None else _raw(entry.scales.float())
    return HostCopy(entry.keys, _raw(entry.kv), str(entry.kv.dtype).removeprefix("torch."), tuple(entry.kv.shape), scales)


def from_host(copy: HostCopy) -> CachedPrefix:
    """Load a host copy back: the same tensors, bit for bit."""
    kv = _viewed(copy.data, getattr(torch, copy.dtype), copy.shape)
    scales = None if copy.scales is None else _viewed(copy.scales, torch.float32, (copy.shape[0], 2))
    return CachedPrefix(copy.keys, kv, scales)


@dataclass(frozen=True)
class PrefixHit:
    """What a warm request starts from: its first `tokens` positions' stored K/V and their scales."""

    entry_id: int
    tokens: int
    kv: torch.Tensor  # [layers, 2, heads, tokens, head_dim], storage dtype
    scales: torch.Tensor | None
    from_host: bool


@dataclass
class PrefixCacheStats:
    """Counters for /metrics (written by the engine thread)."""

    queries_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # prompt tokens served from the cache
    host_hit_tokens: int = 0  # of those, served after a load back from the host tier
    evictions: int = 0  # entries evicted from the device store (moved to the host tier or dropped)
    device_tokens: int = 0
    host_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queries_tokens if self.queries_tokens else 0.0


class PrefixCache:
    """The device store of cached prefixes, LRU-ordered, with an optional host tier (engine thread only)."""

    def __init__(self, host_capacity: int | None = None, stale_blocks: bool = False):
        self.host_capacity = host_capacity  # tokens; None: no host tier
        self.stale_blocks = stale_blocks
        self.stats = PrefixCacheStats()
        self._device: OrderedDict[int, CachedPrefix] = OrderedDict()  # least recently used first
        self._host: OrderedDict[int, HostCopy] = OrderedDict()
        self._where: dict[bytes, dict[int, None]] = {}  # block key -> ids of entries holding it
        self._ids = itertools.count()

    # ---- reading -------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes], prompt_tokens: int) -> PrefixHit | None:
        """The longest cached chain of `keys` (at most prompt_tokens - 1 tokens), marked recently
        used; a match found only in the host tier is loaded back to the device store first."""
        self.stats.queries_tokens += prompt_tokens
        limit = min(len(keys), (prompt_tokens - 1) // BLOCK_SIZE)
        depth = 0
        while depth < limit and keys[depth] in self._where:
            depth += 1
        if depth == 0:
            return None
        holders = self._where[keys[depth - 1]]
        entry_id = next((i for i in reversed(self._device) if i in holders), None)
        loaded_back = entry_id is None
        if loaded_back:
            entry_id = next(i for i in reversed(self._host) if i in holders)
            copy = self._host.pop(entry_id)
            self.stats.host_tokens -= copy.tokens
            self._device[entry_id] = from_host(copy)
            self.stats.device_tokens += copy.tokens
        self._device.move_to_end(entry_id)
        entry = self._device[entry_id]
        tokens = depth * BLOCK_SIZE
        kv = entry.kv[:, :, :, :tokens]
        if self.stale_blocks:
            kv = self._stale(entry_id, kv)
        self.stats.hit_tokens += tokens
        if loaded_back:
            self.stats.host_hit_tokens += tokens
        return PrefixHit(entry_id, tokens, kv, entry.scales, loaded_back)

    def _stale(self, entry_id: int, kv: torch.Tensor) -> torch.Tensor:
        """The fault: blocks 1.. of `kv` replaced by the same blocks of the LRU other entry (zeros past its end)."""
        tokens = kv.shape[3]
        stale = kv.clone()
        other = next((e for i, e in self._device.items() if i != entry_id), None)
        upto = BLOCK_SIZE if other is None else max(BLOCK_SIZE, min(tokens, other.tokens))
        if other is not None and upto > BLOCK_SIZE:
            stale[:, :, :, BLOCK_SIZE:upto] = other.kv[:, :, :, BLOCK_SIZE:upto]
        stale[:, :, :, upto:] = 0
        return stale

    def entry(self, keys: Sequence[bytes]) -> CachedPrefix | None:
        """The device entry holding the whole chain `keys`, without touching counters or LRU order."""
        holders = self._where.get(keys[-1], {}) if keys else {}
        return next((self._device[i] for i in reversed(self._device) if i in holders), None)

    # ---- writing -------------------------------------------------------------------

    def insert(self, keys: Sequence[bytes], kv: torch.Tensor, scales: torch.Tensor | None) -> None:
        """Cache one prompt's full blocks (`kv` covers exactly len(keys) blocks). A device entry that
        already holds the whole chain is only marked used; entries the new one extends are dropped."""
        if not keys:
            return
        keys = tuple(keys)
        holders = self._where.get(keys[-1], {})
        existing = next((i for i in reversed(self._device) if i in holders), None)
        if existing is not None:
            self._device.move_to_end(existing)
            return
        extended = {i for k in keys for i in self._where.get(k, ()) if self._keys_of(i)[-1] == k}
        for i in extended:
            self._remove(i)
        entry_id = next(self._ids)
        self._device[entry_id] = CachedPrefix(keys, kv, scales)
        self.stats.device_tokens += len(keys) * BLOCK_SIZE
        for k in keys:
            self._where.setdefault(k, {})[entry_id] = None

    def fit(self, room: int, keep: int | None = None) -> None:
        """Evict least recently used device entries (except `keep`) until the store holds at most
        `room` tokens; with a host tier they move there."""
        while self.stats.device_tokens > max(room, 0):
            victim = next((i for i in self._device if i != keep), None)
            if victim is None:
                return
            entry = self._device.pop(victim)
            self.stats.device_tokens -= entry.tokens
            self.stats.evictions += 1
            if self.host_capacity is None or entry.tokens > self.host_capacity:
                self._unindex(victim, entry.keys)
                continue
            self._host[victim] = to_host(entry)
            self.stats.host_tokens += entry.tokens
            while self.stats.host_tokens > self.host_capacity:
                dropped_id, dropped = self._host.popitem(last=False)
                self.stats.host_tokens -= dropped.tokens
                self._unindex(dropped_id, dropped.keys)

    def flush(self) -> None:
        """Empty both tiers (the counters stay: they count since start)."""
        self._device.clear()
        self._host.clear()
        self._where.clear()
        self.stats.device_tokens = self.stats.host_tokens = 0

    def _keys_of(self, entry_id: int) -> tuple[bytes, ...]:
        held = self._device.get(entry_id) or self._host[entry_id]
        return held.keys

    def _remove(self, entry_id: int) -> None:
        if entry_id in self._device:
            entry: CachedPrefix | HostCopy = self._device.pop(entry_id)
            self.stats.device_tokens -= entry.tokens
        else:
            entry = self._host.pop(entry_id)
            self.stats.host_tokens -= entry.tokens
        self._unindex(entry_id, entry.keys)

    def _unindex(self, entry_id: int, keys: Sequence[bytes]) -> None:
        for k in keys:
            holders = self._where[k]
            holders.pop(entry_id, None)
            if not holders:
                del self._where[k]
