"""The gate: policy + per-unit paired inputs → criteria → PASS / FAIL / INCONCLUSIVE.

    policy.py      `[gate]`: bounds, α, mode (default | strict), planned looks
    inputs.py      the paired arrays it judges, every unit tagged with its cluster (item or context)
    criteria.py    one function per criterion: estimate, interval, pass and fail tests, n_more
    criterion.py   the `Criterion` value and the one-sided t test the criteria share
    tokens.py      the token-level criteria (KL, top-1): betting bound, Hall-corrected t
    tail.py        broken_share: the share of prompts the candidate broke, beyond the A/A floor's
    sequential.py  Pocock nominal levels that keep α over K looks
    verdict.py     Holm over fail tests, intersection–union over primary criteria, the replay of looks
    futility.py    "on its margin": the predictive-power futility stop, a new compare's size
    origin.py      where each bound came from (built-in derivation, `kvqual calibrate`, by hand)

Formulas and the defaults' reasons: docs/statistics.md; error rates: docs/calibration.md.
"""

from kvqual.gate.criteria import Criterion, Direction, Role, Status
from kvqual.gate.inputs import (AccuracyPairs, BrokenUnits, CachePairs, GateInputs, LengthPairs, RatePairs, RequestCounts,
                                SteadySpeed, TokenCoverage, TokenPairs, UnusableAnswers)
from kvqual.gate.policy import GatePolicy
from kvqual.gate.sequential import look_sizes, nominal_alpha, pocock_critical
from kvqual.gate.verdict import EXIT_CODES, Verdict, combine, decide, decide_sequence

__all__ = [
    "AccuracyPairs", "BrokenUnits", "CachePairs", "UnusableAnswers", "Criterion", "Direction", "EXIT_CODES", "GateInputs", "GatePolicy", "LengthPairs",
    "RatePairs", "RequestCounts", "Role", "Status", "SteadySpeed", "TokenCoverage", "TokenPairs", "Verdict", "combine",
    "decide", "decide_sequence", "look_sizes", "nominal_alpha", "pocock_critical",
]
