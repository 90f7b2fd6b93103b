"""kvqual.judge.tokens: KL approximation against exact KLs, per-position metrics, loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvqual.judge import tokens as tk


def _logsoftmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x)


def _top(logp: np.ndarray, k: int) -> dict[str, float]:
    return {f"t{i}": float(logp[i]) for i in np.argsort(logp)[::-1][:k]}


def _exact(lp: np.ndarray, lq: np.ndarray, k: int) -> tuple[float, float]:
    """(full KL, KL on the partition base-top-k + tail with exact candidate masses)."""
    p, q = np.exp(lp), np.exp(lq)
    s = np.argsort(lp)[::-1][:k]
    pt, qt = 1 - p[s].sum(), 1 - q[s].sum()
    coarse = float(np.sum(p[s] * (lp[s] - lq[s])) + pt * math.log(pt / qt))
    return float(np.sum(p * (lp - lq))), coarse


def test_kl_of_identical_maps_is_zero() -> None:
    top = {"a": math.log(0.7), "b": math.log(0.2)}
    assert tk.topk_kl(top, top) == pytest.approx(0.0, abs=1e-15)


def test_kl_hand_worked_two_tokens_plus_tail() -> None:
    base = {"a": math.log(0.7), "b": math.log(0.2)}
    cand = {"a": math.log(0.5), "b": math.log(0.4)}
    expected = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.4) + 0.1 * math.log(0.1 / 0.1)
    assert tk.topk_kl(base, cand) == pytest.approx(expected)


def test_missing_token_gets_bounded_share_of_unlisted_mass() -> None:
    base = {"a": math.log(0.6), "b": math.log(0.3)}
    cand = {"a": math.log(0.6), "c": math.log(0.3)}  # b missing: q_b = min(0.3, 0.1/2) = 0.05
    q_tail = 1 - 0.6 - 0.05
    expected = 0.3 * math.log(0.3 / 0.05) + 0.1 * math.log(0.1 / q_tail)
    assert tk.topk_kl(base, cand) == pytest.approx(expected)


def test_kl_equals_exact_partition_kl_when_topk_sets_agree() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 6, 500)
    lp, lq = _logsoftmax(logits), _logsoftmax(logits + rng.normal(0, 0.02, 500))
    bt, ct = _top(lp, 20), _top(lq, 20)
    assert set(bt) == set(ct)
    assert tk.topk_kl(bt, ct) == pytest.approx(_exact(lp, lq, 20)[1], rel=1e-9)


@pytest.mark.parametrize("noise,k,tol", [(0.2, 20, 0.05), (1.0, 20, 0.10), (0.2, 5, 0.25)])
def test_kl_approximation_against_exact_full_distributions(noise: float, k: int, tol: float) -> None:
    """Peaked vocab-2000 distributions: approx ≤ partition KL ≤ full KL, close in median."""
    rng = np.random.default_rng(1)
    ratios_full, over = [], 0
    for _ in range(200):
        logits = rng.normal(0, 6, 2000)
        lp, lq = _logsoftmax(logits), _logsoftmax(logits + rng.normal(0, noise, 2000))
        full, coarse = _exact(lp, lq, k)
        approx = tk.topk_kl(_top(lp, k), _top(lq, k))
        assert coarse <= full + 1e-12
        over += approx > 1.05 * coarse
        ratios_full.append(approx / full)
    assert over <= 10  # it under-reports, rarely over (≤5% of positions by >5%)
    assert 1 - tol <= float(np.median(ratios_full)) <= 1.0 + 1e-9


def test_kl_is_large_when_candidate_is_garbage() -> None:
    base = {"a": math.log(0.95), "b": math.log(0.03)}
    cand = {"x": math.log(0.9), "y": math.log(0.09)}
    assert tk.topk_kl(base, cand) > 2.0


def test_same_top1_and_position_metrics() -> None:
    base = {"a": -0.1, "b": -2.5}
    cand = {"b": -0.2, "a": -1.8}
    assert tk.same_top1(base, base) and not tk.same_top1(base, cand)
    m = tk.position_metrics(base, cand, base_token_logprob=-0.1, cand_token_logprob=-1.8)
    assert m.delta_logprob == pytest.approx(-1.7)
    assert m.delta_p == pytest.approx(math.exp(-1.8) - math.exp(-0.1))
    assert not m.same_top1 and m.kl > 0


def test_summaries_and_position_buckets() -> None:
    ms = [tk.PositionMetrics(kl=float(i), same_top1=i % 2 == 0, delta_p=0.1, delta_logprob=-0.5) for i in range(100)]
    s = tk.summarize_positions(ms)
    assert s.n_tokens == 100 and s.mean_kl == pytest.approx(49.5) and s.same_top1_rate == 0.5
    assert s.rms_delta_p == pytest.approx(0.1) and s.p99_kl == pytest.approx(98.01)
    positions = list(range(0, 2000, 20))
    buckets = tk.bucket_by_position(positions, ms)
    assert [(b.start, b.end) for b in buckets] == [(0, 64), (64, 256), (256, 1024), (1024, None)]
    assert [b.summary.n_tokens for b in buckets if b.summary] == [4, 9, 39, 48]
    assert tk.bucket_by_position([0], ms[:1])[3].summary is None


def test_first_divergence_and_exact_match() -> None:
    assert tk.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert tk.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert tk.first_divergence([1, 2], [1, 2, 3]) == 2
    assert tk.first_divergence("", "") is None
    assert tk.exact_match("abc", "abc") and not tk.exact_match("abc", "abd")


def test_repetition_loop_found_on_crafted_outputs() -> None:
    loop = tk.text_repetition_loop("The answer is 42. " + "I think so. " * 20)
    assert loop is not None and loop.period == len("I think so. ") and loop.repeats >= 19
    assert tk.text_repetition_loop("Sure!" + "!" * 200) is not None
    tokens = list(range(50)) + [7, 8, 9] * 15
    found = tk.repetition_loop(tokens)
    assert found is not None and found.period == 3 and found.span == 45


def test_repetition_loop_not_found_in_normal_text() -> None:
    text = (
        "To solve this, first compute 3 * 4 = 12. Then add 5 to get 17. "
        "Finally, subtract 2: 17 - 2 = 15. So the answer is 15.\n\n1. Eggs\n2. Milk\n3. Bread\n"
    )
    assert tk.text_repetition_loop(text) is None
    assert tk.text_repetition_loop("ha ha ha ha ha") is None  # too short to be a loop
    assert tk.repetition_loop([1, 2, 3, 1, 2, 3, 1, 2, 3]) is None


def _own(gen_lps, echo_lps):
    from kvqual.forced import Forced
    from kvqual.records import Sample, TokenLogprobs

    toks = tuple(f"t{i}" for i in range(len(gen_lps)))
    sample = Sample(id="a", suite="s", repeat=0, text="".join(toks), finish_reason="stop",
                    completion_tokens=len(toks), error=None, logprobs=TokenLogprobs(toks, tuple(gen_lps)))
    forced = Forced("s", "a", 0, True, None, TokenLogprobs(toks, tuple(echo_lps)))
    return sample, forced


def test_echo_trust_tolerates_fp8_scale_noise_not_a_shifted_echo():
    import pytest

    from kvqual.forcing.teacher import check_echo_trust
    from kvqual.errors import ServerContractError

    gen = [-0.1, -2.3, -0.05, -1.7, -0.4, -3.1, -0.2, -0.9]
    e5m2_like = [g + d for g, d in zip(gen, [0.11, -0.12, 0.09, -0.1, 0.13, -0.1, 0.1, -0.11])]
    assert check_echo_trust([_own(gen, e5m2_like)], "srv") == pytest.approx(0.1075)
    shifted = gen[1:] + [-0.3]  # echo off by one position
    with pytest.raises(ServerContractError, match="srv: echo logprobs .*mean \\|Δ\\| 1\\.[0-9]+ nats > 0.5") as err:
        check_echo_trust([_own(gen, shifted)], "srv")
    assert "observed: echo looks shifted by one position" in str(err.value)
    noisy = [g - 2.0 * (i % 2) - 0.7 for i, g in enumerate(gen)]  # disagrees everywhere, not a shift
    with pytest.raises(ServerContractError) as err:
        check_echo_trust([_own(gen, noisy)], "srv")
    assert "prefill" in err.value.cause and "shifted" not in err.value.cause


def test_completion_slice_drops_the_token_generated_after_an_echo():
    """echo with max_tokens=1 on a server that reports no usage: the positions at or past the end of
    the text sent are the generated token, not part of the completion being scored."""
    from kvqual.forcing.teacher import completion_slice
    from kvqual.records import TokenLogprobs

    prompt, completion = "Q: hi\nA:", " ok there"
    toks = ("Q", ":", " hi", "\n", "A", ":", " ok", " there", " !")
    offs = (0, 1, 2, 5, 6, 7, 8, 11, 17)
    echo = TokenLogprobs(toks, (None,) + tuple(-0.1 * i for i in range(1, 9)), tuple({t: -0.1} for t in toks), offs)
    generated = TokenLogprobs((" ok", " there"), (-0.6, -0.7))
    part, why = completion_slice(echo, len(prompt), generated, end=len(prompt + completion))
    assert why is None and part.tokens == (" ok", " there") and part.text_offset == (8, 11)
    whole, why = completion_slice(echo, len(prompt), generated)  # without `end` the extra token leaks in
    assert whole is None and why == "re-tokenized completion differs from the generated tokens"


def test_distinct_n_counts_repeated_word_ngrams():
    from kvqual.judge.tokens import distinct_n

    assert distinct_n("the cat sat on the mat") == 1.0  # 5 bigrams, all different
    assert distinct_n("a b a b a b") == 2 / 5  # (a b), (b a) over 5 bigrams
    assert distinct_n("one") is None and distinct_n("") is None
    assert distinct_n("x y z x y z", n=3) == 3 / 4
