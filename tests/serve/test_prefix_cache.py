"""The prefix cache (prefixcache.py) on small tensors, and its wiring into the KV cache, the
engine's flush and the CLI; the real model's warm vs cold paths are in test_prefix_cache_server.py."""

import types

import pytest
import torch

from kvqual.serve.cli import main
from kvqual.serve.dtypes import check_hicache, check_kv_fault
from kvqual.serve.kvcache import KvCache, fp8_dequantize, fp8_quantize
from kvqual.serve.prefixcache import (
    BLOCK_SIZE,
    PrefixCache,
    block_keys,
    from_host,
    host_capacity_tokens,
    to_host,
)

LAYERS, HEADS, DIM = 2, 3, 4


def _kv(tokens, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(LAYERS, 2, HEADS, tokens, DIM, generator=g) * 3).to(dtype)


def _insert(cache, ids, seed=0, salt=None, dtype=torch.bfloat16, scales=None):
    keys = block_keys(ids, salt)
    kv = _kv(len(keys) * BLOCK_SIZE, seed, dtype)
    cache.insert(keys, kv, scales)
    return keys, kv


def test_block_keys_are_a_hash_chain_of_full_blocks():
    ids = list(range(100, 150))  # 3 full blocks and 2 tokens
    keys = block_keys(ids)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert block_keys(ids[:48]) == keys and block_keys(ids[:47]) == keys[:2]
    changed = block_keys(ids[:20] + [7] + ids[21:])  # a token of block 1
    assert changed[0] == keys[0] and changed[1] != keys[1] and changed[2] != keys[2]  # the chain carries it on
    first = block_keys([7] + ids[1:])
    assert all(a != b for a, b in zip(first, keys))


def test_salt_changes_every_block_and_isolates_entries():
    ids = list(range(64))
    plain, a, b = block_keys(ids), block_keys(ids, "a"), block_keys(ids, "b")
    assert len({*plain, *a, *b}) == 12  # block 0 carries the salt, the chain carries it to the rest
    cache = PrefixCache()
    _insert(cache, ids, salt="a")
    assert cache.lookup(block_keys(ids, "b"), 64) is None
    assert cache.lookup(block_keys(ids), 64) is None  # no salt is a namespace of its own
    assert cache.lookup(block_keys(ids, "a"), 64).tokens == 48


def test_longest_match_leaves_the_last_prompt_token_to_compute():
    ids = list(range(48))
    cache = PrefixCache()
    _, kv = _insert(cache, ids)
    same = cache.lookup(block_keys(ids), 48)
    assert same.tokens == 32  # all 3 blocks cached, but the last token's logits are needed
    assert torch.equal(same.kv, kv[:, :, :, :32])
    assert cache.lookup(block_keys(ids + [5]), 49).tokens == 48
    assert cache.lookup(block_keys(ids[:40] + [9] * 9), 49).tokens == 32  # diverges in block 2
    assert cache.lookup(block_keys([9] + ids[1:]), 48) is None
    assert cache.lookup(block_keys(ids[:16]), 16) is None  # a one-block prompt: nothing may be served
    s = cache.stats
    assert (s.queries_tokens, s.hit_tokens) == (48 + 49 + 49 + 48 + 16, 32 + 48 + 32)
    assert s.hit_rate == pytest.approx(112 / 210)


def test_fit_evicts_least_recently_used_down_to_the_room():
    cache = PrefixCache()
    a, _ = _insert(cache, [1] * 33)
    b, _ = _insert(cache, [2] * 33)
    c, _ = _insert(cache, [3] * 33)
    cache.lookup(a, 33)  # a is now the most recently used
    cache.fit(64)
    assert cache.stats.device_tokens == 64 and cache.stats.evictions == 1
    assert cache.lookup(b, 33) is None and cache.lookup(c, 33) is not None
    cache.fit(0, keep=cache.lookup(a, 33).entry_id)  # a running request's hit stays while it is used
    assert cache.stats.device_tokens == 32 and cache.lookup(c, 33) is None
    cache.fit(-5)  # running requests reserve more than the budget: nothing stays
    assert cache.stats.device_tokens == 0 and cache.stats.evictions == 3


def test_insert_keeps_one_entry_per_chain():
    cache = PrefixCache()
    short, _ = _insert(cache, list(range(32)))
    long, long_kv = _insert(cache, list(range(64)), seed=1)  # extends the first: it replaces it
    assert cache.stats.device_tokens == 64
    assert torch.equal(cache.lookup(short + [b"x"], 40).kv, long_kv[:, :, :, :32])  # served from the long entry
    cache.insert(long[:2], _kv(32), None)  # already held whole: only marked used
    assert cache.stats.device_tokens == 64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_host_copy_is_a_byte_round_trip(dtype):
    keys = block_keys(list(range(32)))
    kv, scales = _kv(32, dtype=dtype), torch.rand(LAYERS, 2)
    copy = to_host(types.SimpleNamespace(keys=tuple(keys), kv=kv, scales=scales))
    assert isinstance(copy.data, bytes) and len(copy.data) == kv.numel() * kv.element_size()
    back = from_host(copy)
    assert back.kv.dtype == dtype and back.kv.shape == kv.shape
    assert torch.equal(back.kv.view(torch.uint8), kv.view(torch.uint8)) and torch.equal(back.scales, scales)
    assert back.kv.data_ptr() != kv.data_ptr()


def test_evicted_entries_move_to_the_host_tier_and_load_back():
    cache = PrefixCache(host_capacity=64)
    a, kv_a = _insert(cache, [1] * 33, dtype=torch.float8_e4m3fn, scales=torch.full((LAYERS, 2), 0.5))
    b, _ = _insert(cache, [2] * 33, seed=1)
    cache.fit(32)  # a goes to the host tier
    assert (cache.stats.device_tokens, cache.stats.host_tokens, cache.stats.evictions) == (32, 32, 1)
    hit = cache.lookup(a, 33)
    assert hit.from_host and hit.tokens == 32 and cache.stats.host_hit_tokens == 32
    assert torch.equal(hit.kv.view(torch.uint8), kv_a.view(torch.uint8))
    assert torch.equal(hit.scales, torch.full((LAYERS, 2), 0.5))
    assert (cache.stats.device_tokens, cache.stats.host_tokens) == (64, 0)  # it is on device again
    for n in (3, 4, 5):
        _insert(cache, [n] * 33, seed=n)
        cache.fit(32)
    assert cache.stats.host_tokens == 64  # the host tier drops its least recently used past 64 tokens
    assert cache.lookup(a, 33) is None and cache.lookup(b, 33) is None
    cache.flush()
    assert (cache.stats.device_tokens, cache.stats.host_tokens) == (0, 0)
    assert cache.lookup(block_keys([5] * 33), 33) is None


def test_without_a_host_tier_evicted_entries_are_gone():
    cache = PrefixCache()
    a, _ = _insert(cache, [1] * 33)
    cache.fit(0)
    assert cache.lookup(a, 33) is None and cache.stats.host_tokens == 0


def test_stale_blocks_serve_the_lru_other_entrys_slots():
    cache = PrefixCache(stale_blocks=True)
    other_keys, other = _insert(cache, [7] * 33, seed=1)  # 2 blocks: the least recently used other entry
    ids = list(range(65))
    keys, kv = _insert(cache, ids, seed=2)  # 4 blocks
    hit = cache.lookup(keys, 65)
    assert hit.tokens == 64
    assert torch.equal(hit.kv[:, :, :, :16], kv[:, :, :, :16])  # the first block is its own
    assert torch.equal(hit.kv[:, :, :, 16:32], other[:, :, :, 16:32])  # then the other entry's block 1
    assert not hit.kv[:, :, :, 32:].any()  # which has no blocks 2, 3: zeros
    cache.flush()
    keys, kv = _insert(cache, ids, seed=2)
    alone = cache.lookup(keys, 65)
    assert torch.equal(alone.kv[:, :, :, :16], kv[:, :, :, :16]) and not alone.kv[:, :, :, 16:].any()


def test_host_capacity_from_size_or_ratio():
    assert host_capacity_tokens(1000, 23040, 0.01, 2.0) == int(0.01 * 1e9 // 23040)  # GB, as SGLang
    assert host_capacity_tokens(1000, 23040, 0, 2.5) == 2500


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_kv_cache_loads_a_prefix_as_its_own_prefill_stored_it(dtype):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, HEADS, 40, DIM, generator=g) * 5, torch.randn(1, HEADS, 40, DIM, generator=g)
    cold = KvCache(LAYERS, dtype)
    for layer in cold.layers:
        layer.update(k, v)
    kv, scales = cold.stored_prefix(32)
    assert kv.shape == (LAYERS, 2, HEADS, 32, DIM) and (scales is None) == (dtype == "bf16")
    warm = KvCache(LAYERS, dtype)
    warm.load_prefix(kv, scales, torch.float32, 40)
    for c_layer, w_layer in zip(cold.layers, warm.layers):
        k_read, v_read = w_layer.update(k[:, :, 32:], v[:, :, 32:])  # the rest of the prompt, adopted scales
        assert torch.equal(k_read, c_layer.keys) and torch.equal(v_read, c_layer.values)
        assert all(torch.equal(a, b) for a, b in zip(w_layer.stored(), c_layer.stored()))
    assert warm.length() == 40


def test_fp8_prefix_read_back_is_decoded_like_the_layer_decodes_with_faults():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, HEADS, 32, DIM, generator=g) * 4
    scale = torch.full((1, 1, 1, 1), 0.01)
    q = fp8_quantize(x, torch.float8_e4m3fn, scale)
    kv = torch.stack([torch.stack([q[0], q[0]])] * LAYERS)
    scales = torch.full((LAYERS, 2), 0.01)
    healthy, broken = KvCache(LAYERS, "fp8_e4m3"), KvCache(LAYERS, "fp8_e4m3", kv_fault="ignore-scale-on-read")
    healthy.load_prefix(kv, scales, torch.float32, 32)
    broken.load_prefix(kv, scales, torch.float32, 32)
    assert torch.equal(healthy.layers[0].keys, fp8_dequantize(q, scale, torch.float32))
    assert torch.equal(broken.layers[0].keys, q.float())  # the fault still applies on read


def test_stale_cache_block_needs_prefix_caching_and_takes_any_dtype():
    with pytest.raises(ValueError, match="needs prefix caching"):
        check_kv_fault("bf16", "stale-cache-block")
    assert check_kv_fault("bf16", "stale-cache-block", prefix_caching=True) == "stale-cache-block"
    assert check_kv_fault("fp8_e5m2", "stale-cache-block", prefix_caching=True) == "stale-cache-block"
    with pytest.raises(ValueError, match="needs an fp8 KV cache"):
        check_kv_fault("bf16", "drop-scale", prefix_caching=True)
    with pytest.raises(ValueError):
        check_hicache(0, 0)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_cli_refuses_stale_cache_block_without_prefix_caching_in_one_line(dtype, capsys):
    assert main(["--kv-cache-dtype", dtype, "--kv-fault", "stale-cache-block"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kvqual serve: --kv-fault stale-cache-block needs prefix caching (--enable-prefix-caching")


def test_cli_refuses_a_negative_hicache_size(capsys):
    assert main(["--enable-hierarchical-cache", "--hicache-size", "-1"]) == 2
    assert capsys.readouterr().err.startswith("kvqual serve: --hicache-size must be")


def _idle_engine(cache):
    from kvqual.serve.engine import Engine

    model = types.SimpleNamespace(get_decoder=lambda: None, get_output_embeddings=lambda: None,
                                  generation_config=types.SimpleNamespace(eos_token_id=2))
    loaded = types.SimpleNamespace(model=model, tokenizer=types.SimpleNamespace(eos_token_id=2))
    return Engine(loaded, "bf16", "dynamic", 4, 64, 1000, prefix_cache=cache)  # its thread is not started


def test_flush_waits_for_idle_but_reset_does_not():
    from kvqual.serve.engine import _Flush

    cache = PrefixCache()
    _insert(cache, list(range(33)))
    engine = _idle_engine(cache)
    answers = []
    engine._pending.append(object())  # a queued request
    engine._take(_Flush(True, answers.append))
    assert answers == [False] and cache.stats.device_tokens == 32
    engine._take(_Flush(False, answers.append))
    assert answers == [False, True] and cache.stats.device_tokens == 0
    engine._pending.clear()
    _insert(cache, list(range(33)))
    engine._take(_Flush(True, answers.append))
    assert answers[-1] is True and cache.stats.device_tokens == 0
