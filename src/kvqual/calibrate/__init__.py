"""`kvqual calibrate`: token margins derived on the user's own model, servers and suites.

    derive.py   pure: a known-good and a known-bad compare's intervals → M1, the margin, or a refusal;
                the `[gate]` table with its `[gate.provenance]` as TOML text
    flow.py     the two compares (BASE vs GOOD, BASE vs BAD) through the compare machinery, fixed-n
    cli.py      the command: arguments, the one-line refusals, where the table goes

docs/statistics.md, "Calibrated margins", says why the margin is half of M1.
"""

from kvqual.calibrate.derive import DEFAULT_FRACTION, TOKEN_CRITERIA, derive_margin, gate_table

__all__ = ["DEFAULT_FRACTION", "TOKEN_CRITERIA", "derive_margin", "gate_table"]
