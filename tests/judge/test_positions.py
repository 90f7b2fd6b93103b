"""The vectorized position metrics (judge/positions.py) against the per-position reference
(judge/tokens.py), on random top-k maps with token strings and with token ids."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from kvqual.judge import positions as pos
from kvqual.judge import tokenarrays
from kvqual.judge import tokens as tk
from kvqual.records import TokenLogprobs


def _f32(x: float) -> float:
    return float(np.float32(x))  # top-k logprobs are stored as float32 (tokenstore.py)


def _record(rng: np.random.Generator, n: int, vocab: list[str], k: int = 5) -> TokenLogprobs:
    tokens = tuple(rng.choice(vocab, n))
    tops = []
    for _ in range(n):
        names = rng.choice(vocab, size=int(rng.integers(1, k + 1)), replace=False)
        lps = np.sort(np.log(rng.dirichlet(np.ones(len(names) + 1)))[: len(names)])[::-1]
        if rng.random() < 0.1 and len(names) > 1:
            lps[1] = lps[0]  # a tie on top-1, broken by token string
        tops.append({str(t): _f32(v) for t, v in zip(names, lps)})
    return TokenLogprobs(tokens=tokens, token_logprobs=tuple(float(v) for v in -rng.random(n)),
                         top_logprobs=tuple(tops))


def _perturb(rng: np.random.Generator, lp: TokenLogprobs, vocab: list[str]) -> TokenLogprobs:
    tops = []
    for top in lp.top_logprobs:
        new = {t: _f32(v + rng.normal(0, 0.3)) for t, v in top.items()}
        if rng.random() < 0.3:  # an alternative the other side did not list
            new[str(rng.choice(vocab))] = _f32(-rng.random() * 3)
        if rng.random() < 0.2 and len(new) > 1:
            new.pop(next(iter(new)))
        tops.append(new)
    return TokenLogprobs(tokens=lp.tokens, token_logprobs=tuple(v - rng.random() * 0.1 for v in lp.token_logprobs),
                         top_logprobs=tuple(tops))


@pytest.mark.parametrize("vocab", [[f"w{i}" for i in range(12)], [f"token_id:{i}" for i in range(12)]],
                         ids=["strings", "ids"])
def test_vectorized_metrics_equal_the_reference(vocab: list[str]) -> None:
    rng = np.random.default_rng(11)
    base = {("s", str(i), 0): _record(rng, int(rng.integers(1, 40)), vocab) for i in range(30)}
    cand = {k: _perturb(rng, v, vocab) for k, v in base.items()}
    other = next(iter(cand))
    cand[other] = TokenLogprobs(tokens=cand[other].tokens[:-1] + ("zz",), token_logprobs=cand[other].token_logprobs,
                                top_logprobs=cand[other].top_logprobs)  # different tokens: left out
    a, b = pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(cand))
    pp = pos.compare_forced(a, b, sorted(base))
    assert pp.differ == {other}
    assert len(pp.keys) == len(base) - 1
    for i, key in enumerate(pp.keys):
        ref = [tk.position_metrics(ta, tb, la, lb) for ta, tb, la, lb in
               zip(base[key].top_logprobs, cand[key].top_logprobs, base[key].token_logprobs, cand[key].token_logprobs)]
        s, e = pp.starts[i], pp.starts[i + 1]
        assert pp.kl[s:e] == pytest.approx([m.kl for m in ref], rel=1e-9, abs=1e-12)
        assert pp.same_top1[s:e].tolist() == [m.same_top1 for m in ref]
        assert pp.delta_p[s:e] == pytest.approx([m.delta_p for m in ref], abs=1e-6)
        assert pp.delta_logprob[s:e] == pytest.approx([m.delta_logprob for m in ref], abs=1e-6)
        assert pp.position[s:e].tolist() == list(range(e - s))
    means = pp.mean(pp.kl)
    assert means[0] == pytest.approx(float(np.mean(pp.kl[pp.starts[0]:pp.starts[1]])))


def test_reproduced_is_bit_for_bit() -> None:
    rng = np.random.default_rng(12)
    vocab = [f"token_id:{i}" for i in range(20)]
    base = {("s", str(i), 0): _record(rng, 10, vocab) for i in range(5)}
    again = dict(base)
    changed = ("s", "3", 0)
    top = dict(base[changed].top_logprobs[4])
    first = next(iter(top))
    top[first] = _f32(top[first] - 1e-3)
    again[changed] = TokenLogprobs(base[changed].tokens, base[changed].token_logprobs,
                                   base[changed].top_logprobs[:4] + (top,) + base[changed].top_logprobs[5:])
    same = pos.reproduced(pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(again)), sorted(base))
    assert same == {k: k != changed for k in sorted(base)}
    # the judge's chunked, early-stopping form says what all() of the per-pair answers says
    a, b = pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(again))
    assert pos.all_reproduced(a, b, sorted(base)) is False
    assert pos.all_reproduced(a, b, [k for k in sorted(base) if k != changed]) is True
    assert pos.all_reproduced(a, b, []) is True
    shorter = {**base, changed: TokenLogprobs(base[changed].tokens[:-1], base[changed].token_logprobs[:-1],
                                              base[changed].top_logprobs[:-1])}
    assert pos.all_reproduced(a, pos.from_logprobs(_wrap(shorter)), sorted(base)) is False


def test_all_reproduced_over_many_chunks(monkeypatch) -> None:
    rng = np.random.default_rng(5)
    vocab = [f"token_id:{i}" for i in range(50)]
    base = {("s", f"{i:03d}", 0): _record(rng, 40, vocab) for i in range(30)}
    a = pos.from_logprobs(_wrap(base))
    monkeypatch.setattr(pos, "CHUNK", 64)  # 1,200 positions: many chunks, pairs across their edges
    assert pos.all_reproduced(a, pos.from_logprobs(_wrap(base)), sorted(base)) is True
    last = ("s", "029", 0)
    lp = base[last]
    again = {**base, last: TokenLogprobs(lp.tokens, lp.token_logprobs[:-1] + (lp.token_logprobs[-1] - 1e-3,),
                                         lp.top_logprobs)}
    b = pos.from_logprobs(_wrap(again))
    assert pos.all_reproduced(a, b, sorted(base)) is False  # only the last position of the last chunk differs
    assert all(pos.reproduced(a, b, sorted(base)).values()) is False


def test_base_top1_is_computed_once_and_matches_per_chunk(monkeypatch) -> None:
    rng = np.random.default_rng(8)
    vocab = [f"token_id:{i}" for i in range(30)]
    base = {("s", str(i), 0): _record(rng, 20, vocab) for i in range(6)}
    cand = {k: _record(rng, 20, vocab) for k in base}
    cand = {k: TokenLogprobs(base[k].tokens, v.token_logprobs, v.top_logprobs) for k, v in cand.items()}
    a = pos.from_logprobs(_wrap(base))
    first = pos.compare_forced(a, pos.from_logprobs(_wrap(cand)), sorted(base))
    cached = a.top1()
    assert a.top1() is cached  # the second comparison of the same pass reuses it
    fresh = pos.compare_forced(pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(cand)), sorted(base))
    assert first.same_top1.tolist() == fresh.same_top1.tolist()
    assert first.same_top1.tolist() == [tk.same_top1(x, y) for k in sorted(base)
                                        for x, y in zip(base[k].top_logprobs, cand[k].top_logprobs)]
    a.release()
    assert a._top1 is None


def test_first_divergence_on_codes() -> None:
    a, b = np.array([1, 2, 3]), np.array([1, 2, 4, 5])
    assert pos.first_divergence(a, b) == tk.first_divergence([1, 2, 3], [1, 2, 4, 5]) == 2
    assert pos.first_divergence(a, a[:2]) == 2
    assert pos.first_divergence(a, a.copy()) is None


class _Rec:
    def __init__(self, lp: TokenLogprobs) -> None:
        self.logprobs = lp


def _wrap(d: dict) -> dict:
    return {k: _Rec(v) for k, v in d.items()}


def test_topk_kl_rows_match_scalar_on_edge_cases() -> None:
    cases = [({"a": math.log(0.7), "b": math.log(0.2)}, {"a": math.log(0.7), "b": math.log(0.2)}),
             ({"a": math.log(0.9)}, {"b": math.log(0.9)}),
             ({"a": math.log(0.5), "b": math.log(0.5)}, {"a": math.log(0.5)})]
    for base_top, cand_top in cases:
        lp_a = TokenLogprobs(("a",), (-0.1,), (base_top,))
        lp_b = TokenLogprobs(("a",), (-0.1,), (cand_top,))
        pp = pos.compare_forced(pos.from_logprobs({("s", "1", 0): _Rec(lp_a)}),
                                pos.from_logprobs({("s", "1", 0): _Rec(lp_b)}), [("s", "1", 0)])
        assert pp.kl[0] == pytest.approx(tk.topk_kl(lp_a.top_logprobs[0], lp_b.top_logprobs[0]), rel=1e-6, abs=1e-9)


def test_common_prefix_is_the_first_differing_character() -> None:
    import os

    from kvqual.judge.metrics import common_prefix

    rng = np.random.default_rng(13)
    for _ in range(2000):
        a, b = ("".join(rng.choice(list("ab"), int(rng.integers(0, 20)))) for _ in range(2))
        assert common_prefix(a, b) == len(os.path.commonprefix([a, b]))


def test_kl_upto_compares_up_to_the_first_differing_token_and_no_further() -> None:
    rng = np.random.default_rng(5)
    vocab = [f"token_id:{i}" for i in range(20)]
    forced = {("s", str(i), 0): _record(rng, 8, vocab) for i in range(3)}
    generated = {k: _perturb(rng, lp, vocab) for k, lp in forced.items()}
    key = ("s", "1", 0)  # its generation parts from the forced tokens at position 3
    g = generated[key]
    other = "token_id:19" if g.tokens[3] != "token_id:19" else "token_id:18"
    generated[key] = TokenLogprobs(g.tokens[:3] + (other,) + g.tokens[4:], g.token_logprobs, g.top_logprobs)
    a, b = pos.from_logprobs(_wrap(forced)), pos.from_logprobs(_wrap(generated))
    out = pos.kl_upto(a, b, {("s", "0", 0): 8, key: 4, ("s", "2", 0): 9})
    expect = np.mean([tk.topk_kl(forced[key].top_logprobs[j], generated[key].top_logprobs[j]) for j in range(4)])
    assert out[key] == pytest.approx(expect, rel=1e-5)  # position 3 (the differing token) is compared
    assert ("s", "2", 0) not in out  # asks for more positions than there are
    assert pos.kl_upto(a, b, {key: 5}) == {}  # past the differing token the contexts differ: left out


def test_first_divergences_match_the_one_pair_form(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    monkeypatch.setattr(pos, "CHUNK", 16)  # pairs across many chunks
    base, other = {}, {}
    for i in range(60):
        n = int(rng.integers(0, 12))
        a = [f"token_id:{int(t)}" for t in rng.integers(0, 4, n)]
        b = list(a)
        kind = i % 5
        if kind == 1 and n:
            b[int(rng.integers(0, n))] = "token_id:9"  # one token differs
        elif kind == 2:
            b = b[: int(rng.integers(0, n + 1))]  # a prefix
        elif kind == 3:
            b = b + ["token_id:1"] * int(rng.integers(1, 4))  # longer
        elif kind == 4:
            b = [f"token_id:{int(t)}" for t in rng.integers(0, 4, int(rng.integers(0, 12)))]
        key = ("s", f"{i:02d}", 0)
        base[key] = TokenLogprobs(tuple(a), (0.0,) * len(a))
        other[key] = TokenLogprobs(tuple(b), (0.0,) * len(b))
    ta, tb = pos.from_logprobs(_wrap(base), top_k=False), pos.from_logprobs(_wrap(other), top_k=False)
    keys = sorted(base)
    assert pos.first_divergences(ta, tb, keys) == [pos.first_divergence(ta.tokens_of(k), tb.tokens_of(k)) for k in keys]
    assert pos.first_divergences(ta, tb, keys) == [tk.first_divergence(base[k].tokens, other[k].tokens) for k in keys]
    assert pos.first_divergences(ta, tb, []) == []


def test_compare_forced_is_the_same_in_any_chunking(monkeypatch) -> None:
    rng = np.random.default_rng(21)
    vocab = [f"token_id:{i}" for i in range(40)]
    base = {("s", f"{i:02d}", 0): _record(rng, int(rng.integers(1, 30)), vocab) for i in range(25)}
    cand = {k: TokenLogprobs(v.tokens, *(_record(rng, len(v.tokens), vocab).__dict__[f]
                                         for f in ("token_logprobs", "top_logprobs"))) for k, v in base.items()}
    keys = sorted(base)
    whole = pos.compare_forced(pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(cand)), keys)
    monkeypatch.setattr(pos, "CHUNK", 7)
    monkeypatch.setattr(tokenarrays, "CHUNK", 7)  # the base's top-1 (TokenArrays.top1) in chunks too
    small = pos.compare_forced(pos.from_logprobs(_wrap(base)), pos.from_logprobs(_wrap(cand)), keys)
    for f in ("starts", "kl", "same_top1", "delta_p", "delta_logprob", "position"):
        assert np.array_equal(getattr(whole, f), getattr(small, f)), f
    assert whole.keys == small.keys == keys and whole.differ == small.differ == set()


def _same_arrays(a: pos.TokenArrays, b: pos.TokenArrays) -> None:
    assert a.index == b.index and a.names == b.names
    for name in ("starts", "tokens", "logprob", "top_codes", "top_lp", "top_ok"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


@pytest.mark.parametrize("top_k", [True, False])
@pytest.mark.parametrize("closed", [True, False], ids=["closed", "being-written"])
def test_load_places_every_batch_as_one_table_would(tmp_path, monkeypatch, top_k: bool, closed: bool) -> None:
    """`load` reads a token file in two passes and converts each batch straight into the file's
    arrays: the result is what converting all its rows as one table gives, whatever the batches
    hold — id tokens, then string tokens (codes widened to int64 mid-file), top-k lists of
    different widths per batch, rows without positions, and (in a file still being written, one
    batch per row) a key written twice, whose later row wins."""
    from kvqual import tokenstore

    rng = np.random.default_rng(7)
    ids, strings = [f"token_id:{i}" for i in range(40)], [f"w{i}" for i in range(40)]
    rows = [(("s", str(i), 0), _record(rng, int(rng.integers(1, 30)), ids, k=3)) for i in range(6)]
    rows.append((("s", "empty", 0), TokenLogprobs(tokens=(), token_logprobs=(), top_logprobs=())))
    rows += [(("s", str(i), 0), _record(rng, int(rng.integers(1, 30)), strings, k=5)) for i in range(4, 9)]
    path = tmp_path / "t.tokens.arrow"
    monkeypatch.setattr(tokenstore, "READ_BATCH", 3)  # closing rewrites the stream in batches of 3 rows
    out = tokenstore.TokenFile.open(path)
    for key, lp in rows:
        out.append(key, lp)
    if closed:
        out.close()  # the last row of each key, in batches of 3
    batches = list(tokenstore.iter_batches(path))
    assert len(batches) == (4 if closed else 12)
    got = pos.load(tmp_path / "t.jsonl", top_k=top_k)
    _same_arrays(got, pos.TokenArrays.from_table(pa.Table.from_batches(batches), top_k))
    assert got.tokens.dtype == np.int64  # string codes past the id rows
    assert len(got.index) == 10 and got.index[("s", "4", 0)] == (5 if closed else 7)  # closed: rows 4 and 5 of ids went
    lp = rows[7][1]  # key 4's later row
    assert [got.name(int(c)) for c in got.tokens_of(("s", "4", 0))] == list(lp.tokens)
    if top_k:
        first = got.top_codes[got.starts[got.index[("s", "4", 0)]]]
        assert [got.name(int(c)) for c in first if c != pos.PAD] == list(lp.top_logprobs[0])
    if not closed:
        out.close()


def test_load_of_ids_only_keeps_int32_codes(tmp_path) -> None:
    from kvqual import tokenstore

    rng = np.random.default_rng(3)
    out = tokenstore.TokenFile.open(tmp_path / "t.tokens.arrow")
    for i in range(5):
        out.append(("s", str(i), 0), _record(rng, 10, [f"token_id:{j}" for j in range(50)]))
    out.close()
    got = pos.load(tmp_path / "t.jsonl")
    assert got.tokens.dtype == np.int32 and got.top_codes.dtype == np.int32
    assert got.top_codes.shape == (50, 5)


def test_a_token_tied_for_top_1_is_a_top_1_whatever_top_k_was_asked() -> None:
    """The audit's "is the token the reference's top-1": a tie counts, so top-1 and top-5 passes agree. With
    top-1 the server lists one of the tied tokens; with top-5 it lists them all, and `top1()` picks the
    larger string."""
    tokens = ("token_id:3", "token_id:3", "token_id:3")
    token_lp = (-0.5, -0.5, -1.0)  # tied with 9 / with 9 and 7 / below 9
    wide = ({"token_id:3": -0.5, "token_id:9": -0.5, "token_id:1": -2.0},
            {"token_id:3": -0.5, "token_id:9": -0.5, "token_id:7": -0.5},
            {"token_id:9": -0.5, "token_id:3": -1.0})
    narrow = ({"token_id:3": -0.5}, {"token_id:9": -0.5, "token_id:3": -0.5}, {"token_id:9": -0.5, "token_id:3": -1.0})
    by_top1, got = [], []
    for tops in (wide, narrow):
        a = pos.from_logprobs(_wrap({("s", "0", 0): TokenLogprobs(tokens=tokens, token_logprobs=token_lp,
                                                                   top_logprobs=tops)}))
        x = np.arange(3)
        by_top1.append((a.top1()[x] == a.tokens[x]).tolist())
        got.append(a.is_top1(x).tolist())
    assert by_top1 == [[False, False, False], [True, False, False]]  # top1() alone depends on the width
    assert got == [[True, True, False], [True, True, False]]
