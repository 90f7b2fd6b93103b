"""The KV cache layers: the fp8 round trip is what attention reads, prefill included."""

import pytest
import torch

from kvqual.serve.kvcache import (
    Bf16Layer,
    KvCache,
    RoundTripFp8Layer,
    check_kv_fault,
    dynamic_scale,
    fp8_dequantize,
    fp8_quantize,
    kv_bytes_per_token,
    kv_capacity_tokens,
    resolve_kv_cache_dtype,
)


def _states(batch=1, heads=3, seq=7, dim=8, seed=0, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, seq, dim, generator=g) * scale, torch.randn(batch, heads, seq, dim, generator=g)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_prefill_reads_fp8_round_trip_bitwise(fp8):
    k, v = _states()
    layer = RoundTripFp8Layer(fp8, "dynamic")
    k_read, v_read = layer.update(k, v)
    k_scale = k.abs().amax() / torch.finfo(fp8).max
    expected_k = (k / k_scale).to(fp8).float() * k_scale
    assert torch.equal(k_read, expected_k)
    assert not torch.equal(k_read, k)  # the first update does not hand back full precision
    stored_k, stored_v = layer.stored()
    assert stored_k.dtype == fp8
    assert torch.equal(stored_k, fp8_quantize(k, fp8, layer.scales()[0]))
    assert torch.equal(v_read, fp8_dequantize(stored_v, layer.scales()[1], torch.float32))


def test_decode_appends_with_frozen_scale_and_saturates():
    k, v = _states(seq=5)
    layer = RoundTripFp8Layer(torch.float8_e4m3fn, "dynamic")
    layer.update(k, v)
    big = torch.full((1, 3, 1, 8), 1e6)
    k_read, _ = layer.update(big, big)
    assert layer.get_seq_length() == 6
    frozen = layer.scales()[0].item()
    assert frozen == pytest.approx(k.abs().amax().item() / 448)
    assert torch.equal(k_read[..., -1, :], torch.full((1, 3, 8), 448 * frozen))
    assert torch.isfinite(k_read).all()


def test_scale_one_clips_at_448():
    x = torch.tensor([[[[1.0, 500.0, -1000.0, 0.3]]]])
    layer = RoundTripFp8Layer(torch.float8_e4m3fn, "1.0")
    k_read, _ = layer.update(x, x)
    assert k_read[0, 0, 0].tolist() == [1.0, 448.0, -448.0, pytest.approx(0.3125)]


def test_dynamic_scale_is_per_row():
    x = torch.ones(2, 1, 2, 2)
    x[1] *= 10
    s = dynamic_scale(x, torch.float8_e4m3fn)
    assert s.shape == (2, 1, 1, 1)
    assert s.flatten().tolist() == pytest.approx([1 / 448, 10 / 448])


def test_bf16_layer_stores_bfloat16_and_reads_round_trip():
    k, v = _states()
    layer = Bf16Layer()
    k_read, _ = layer.update(k, v)
    assert layer.stored()[0].dtype == torch.bfloat16
    assert k_read.dtype == torch.float32
    assert torch.equal(k_read, k.to(torch.bfloat16).float())


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_batch_surgery_keeps_each_rows_values(dtype):
    a, b = KvCache(2, dtype), KvCache(2, dtype)
    ka, va = _states(seq=3, seed=1)
    kb, vb = _states(seq=5, seed=2)
    for i in range(2):
        a.update(ka, va, i)
        b.update(kb, vb, i)
    a_alone = a.layers[0].stored()[0].clone()
    a.extend_rows(b)
    assert a.length() == 5
    stored = a.layers[0].stored()[0]
    assert stored.shape[0] == 2
    assert torch.equal(stored[0, :, 2:], a_alone[0])  # row 0 left-padded by 2
    a.retire([0], trim=2)  # keep row 0, drop its 2 padding positions
    assert a.length() == 3
    assert torch.equal(a.layers[0].stored()[0], a_alone)


def test_capacity_doubles_under_fp8():
    bf16 = kv_capacity_tokens(256 << 20, kv_bytes_per_token(30, 3, 64, "bf16"))
    fp8 = kv_capacity_tokens(256 << 20, kv_bytes_per_token(30, 3, 64, "fp8_e4m3"))
    assert kv_bytes_per_token(30, 3, 64, "bf16") == 23040
    assert fp8 == 2 * bf16 or fp8 == 2 * bf16 + 1


def test_dtype_names():
    assert resolve_kv_cache_dtype("auto") == "bf16"
    assert resolve_kv_cache_dtype("fp8") == "fp8_e4m3"
    with pytest.raises(ValueError):
        resolve_kv_cache_dtype("int4")


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_extend_many_and_retire_in_one_step(dtype):
    caches, alone = [], []
    for seq, seed in ((3, 1), (6, 2), (4, 3)):
        c = KvCache(1, dtype)
        k, v = _states(seq=seq, seed=seed)
        c.update(k, v, 0)
        caches.append(c)
        alone.append((c.layers[0].stored()[0].clone(), c.layers[0].update(k[..., :0, :], v[..., :0, :])[0].clone()))
    first = caches[0]
    first.extend_rows(*caches[1:])  # rows of lengths 3, 6, 4, left-padded to 6
    assert first.length() == 6 and first.layers[0].rows() == 3
    stored = first.layers[0].stored()[0]
    for row, (seq, (own_stored, _)) in enumerate(zip((3, 6, 4), alone)):
        assert torch.equal(stored[row, :, 6 - seq :], own_stored[0])
        assert not stored[row, :, : 6 - seq].any()  # padding is zero
    if dtype != "bf16":  # each row keeps its own scale
        assert torch.equal(first.layers[0].scales()[0][2], caches[2].layers[0].scales()[0][0])
    first.retire([2, 0], trim=2)  # keep the 4- and 3-long rows, drop the common padding
    assert first.length() == 4 and first.layers[0].rows() == 2
    assert torch.equal(first.layers[0].stored()[0][0], alone[2][0][0])
    k_read, _ = first.layers[0].update(*_states(batch=2, seq=1, seed=9))  # decode after surgery
    assert k_read.shape[2] == 5 and torch.equal(k_read[0, :, :4], alone[2][1][0])
    # now with spare rows: a shorter request joins by copying only itself; retiring without a
    # trim moves rows up in place; both keep every row's values (and fp8 scales) intact
    before = first.layers[0].stored()[0].clone()
    late = KvCache(1, dtype)
    kl, vl = _states(seq=2, seed=4)
    late.update(kl, vl, 0)
    buffer = first.layers[0]._store[0]
    first.extend_rows(late)
    assert first.layers[0]._store[0] is buffer  # no rebuild
    stored = first.layers[0].stored()[0]
    assert stored.shape[0] == 3 and torch.equal(stored[:2], before)
    assert torch.equal(stored[2, :, 3:], late.layers[0].stored()[0][0]) and not stored[2, :, :3].any()
    first.retire([1, 2], trim=0)
    assert first.layers[0]._store[0] is buffer
    assert torch.equal(first.layers[0].stored()[0], torch.stack([before[1], stored[2]]))
    if dtype != "bf16":
        assert torch.equal(first.layers[0].scales()[0][1], late.layers[0].scales()[0][0])


def test_fault_ignore_scale_on_read_returns_the_stored_fp8_values_unscaled():
    k, v = _states(seed=5)
    layer = RoundTripFp8Layer(torch.float8_e4m3fn, "dynamic", "ignore-scale-on-read")
    k_read, v_read = layer.update(k, v)
    k_scale, v_scale = layer.scales()
    assert k_scale.item() == pytest.approx(k.abs().amax().item() / 448)  # calibrated on write, as usual
    stored_k, stored_v = layer.stored()
    assert torch.equal(stored_k, fp8_quantize(k, torch.float8_e4m3fn, k_scale))  # written correctly
    assert torch.equal(k_read, stored_k.float()) and torch.equal(v_read, stored_v.float())  # read without it
    assert k_read.abs().max().item() == 448  # x / scale: the largest value is the dtype max
    healthy = RoundTripFp8Layer(torch.float8_e4m3fn, "dynamic").update(k, v)[0]
    assert torch.allclose(k_read * k_scale, healthy)  # off by exactly the scale
    k_next, _ = layer.update(k[..., :1, :], v[..., :1, :])  # decode steps read the same way
    assert torch.equal(k_next[..., -1:, :], layer.stored()[0][..., -1:, :].float())


def test_fault_drop_scale_uses_one_saturates_at_448_and_flushes_tiny_values():
    x = torch.tensor([[[[1.0, 500.0, -1000.0, 0.3, 4e-4, -1e-4]]]])
    layer = RoundTripFp8Layer(torch.float8_e4m3fn, "dynamic", "drop-scale")  # configured dynamic
    k_read, _ = layer.update(x, x)
    assert layer.scales()[0].item() == 1.0 and layer.scales()[1].item() == 1.0
    # past e4m3's max clips to +-448; below half its smallest subnormal (2**-9) becomes 0
    assert k_read[0, 0, 0].tolist() == [1.0, 448.0, -448.0, pytest.approx(0.3125), 0.0, 0.0]
    healthy, _ = RoundTripFp8Layer(torch.float8_e4m3fn, "dynamic").update(x, x)
    assert healthy[0, 0, 0, 2].item() == pytest.approx(-1000.0)  # a calibrated scale keeps it


def test_kv_fault_needs_fp8():
    assert check_kv_fault("fp8_e5m2", "drop-scale") == "drop-scale"
    assert check_kv_fault("bf16", "none") == "none"
    with pytest.raises(ValueError, match="needs an fp8 KV cache"):
        check_kv_fault("bf16", "ignore-scale-on-read")
    with pytest.raises(ValueError, match="unknown kv fault"):
        check_kv_fault("fp8_e4m3", "flip-bits")
    with pytest.raises(ValueError):
        KvCache(2, "bf16", "dynamic", "drop-scale")
    cache = KvCache(2, "fp8_e4m3", "dynamic", "ignore-scale-on-read")
    assert all(layer.kv_fault == "ignore-scale-on-read" for layer in cache.layers)
