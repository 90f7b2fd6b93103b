"""kvqual.gate.sequential: the Pocock boundary over equal and geometric looks, and the look schedule."""

from __future__ import annotations

import numpy as np
import pytest

from kvqual.gate.sequential import information_times, look_sizes, nominal_alpha, pocock_critical


@pytest.mark.parametrize("looks, published", [(2, 2.178), (4, 2.361), (5, 2.413)])
def test_pocock_constants_match_the_published_two_sided_ones(looks: int, published: float) -> None:
    # Pocock (1977), two-sided α = 0.05, equally spaced looks: one-sided α = 0.025 on one side
    assert pocock_critical(0.025, looks) == pytest.approx(published, abs=2e-3)


def test_a_geometric_plan_keeps_its_level_over_all_looks() -> None:
    """Brownian motion observed at 124, 248, 496, 992, 1,984 items: the chance that some look's Z
    crosses the constant boundary is α (Monte Carlo, 400,000 paths: SE 0.0003)."""
    sizes = (124, 248, 496, 992, 1984)
    c = pocock_critical(0.05, sizes)
    assert c == pytest.approx(2.20, abs=0.01) and nominal_alpha(0.05, sizes) == pytest.approx(0.0138, abs=2e-4)
    t = np.asarray(information_times(sizes))
    rng = np.random.default_rng(0)
    steps = rng.normal(size=(400_000, t.size)) * np.sqrt(np.diff(np.r_[0.0, t]))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    assert np.mean((z >= c).any(axis=1)) == pytest.approx(0.05, abs=0.0015)
    # more looks, a stricter level; one look is the plain level
    assert nominal_alpha(0.05, sizes) < nominal_alpha(0.05, (124, 1984)) < 0.05 == nominal_alpha(0.05, (1984,))


def test_look_sizes_double_from_the_first_look_up_to_the_pool() -> None:
    assert look_sizes(1984, 5) == [124, 248, 496, 992, 1984]
    assert look_sizes(1000, 5) == [124, 248, 496, 1000]
    assert look_sizes(300, 5) == [124, 300]
    assert look_sizes(140, 5) == [140]  # a second look of less than a quarter more items is merged
    assert look_sizes(100, 5) == [100] and look_sizes(1984, 1) == [1984] and look_sizes(0, 5) == []
    big = look_sizes(20000, 5)  # more than first·2^(K−1): the ratio grows, still K looks ending at the pool
    assert len(big) == 5 and big[0] == 124 and big[-1] == 20000 and all(b > 2 * a for a, b in zip(big, big[1:]))
    assert look_sizes(496, 5, first=62) == [62, 124, 248, 496]
