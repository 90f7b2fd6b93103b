"""The echo check's words for what it observed (forcing/trust.py)."""

from __future__ import annotations

import pytest

from kvqual.errors import EchoDisagreement
from kvqual.forced import Forced
from kvqual.forcing.trust import check_echo_trust
from kvqual.records import Sample, TokenLogprobs


def _generated(n: int) -> TokenLogprobs:
    """n distinct tokens, each with its logprob and a top-2 (itself and one alternative)."""
    tokens = tuple(f" t{i}" for i in range(n))
    lps = tuple(-0.1 * (i + 1) for i in range(n))
    return TokenLogprobs(tokens, lps, tuple({t: lp, " alt": lp - 1.5} for t, lp in zip(tokens, lps)))


def test_an_echo_whose_whole_distribution_is_one_position_over_is_called_shifted():
    """Issue 53: a server whose echo reads each position's distribution from the one before scores every
    token under its neighbour's distribution, so the chosen tokens' logprobs match nowhere, shifted or
    not; only the top-k lists match one position over. It was described as "not by a one-position shift"."""
    gen = _generated(8)
    top = ({},) + gen.top_logprobs[:-1]  # each position's top-k is the previous position's
    chosen = tuple(None if not t else t.get(tok, min(t.values()) - 5.0) for tok, t in zip(gen.tokens, top))
    echo = TokenLogprobs(gen.tokens, chosen, top)
    sample = Sample(id="a", suite="s", repeat=0, text="".join(gen.tokens), finish_reason="stop",
                    completion_tokens=8, error=None, logprobs=gen)
    forced = Forced("s", "a", 0, True, None, echo, "ids")
    with pytest.raises(EchoDisagreement) as refused:
        check_echo_trust([(sample, forced)], "cand")
    assert "echo looks shifted by one position (its top-k logprobs match the generation's one position over" \
        in str(refused.value), str(refused.value)
