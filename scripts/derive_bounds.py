"""Derive the default token-level bounds (max_kl_excess, max_top1_loss) from comparisons of
configs known to be good and known to be bad on the same model and suite mix.

Procedure (docs/statistics.md, "Defaults and why"): for each token criterion take the largest
estimate among the known-good comparisons (g) and the smallest among the known-bad ones (b);
the bound is their geometric mean √(g·b), halfway between them on the log scale, so each side
sits the same factor (√(b/g)) inside or outside it. Refuses when the two sets overlap (g ≥ b):
then the criterion cannot separate them and no bound derived this way means anything.

On the embedded default (SmolLM2-135M, profile:default, seed 1234):
  good: kvqual compare bf16 fp8 --fixed-n        (fp8_e4m3: accuracy −3.2 points, McNemar p = 0.34)
  bad:  kvqual compare bf16 fp8_e5m2 --fixed-n   (fp8_e5m2: accuracy −8.9 points, 15 vs 4 flips,
        McNemar exact p = 0.019)
  2026-12-01: max_kl_excess = 0.012 (good 0.0056, bad 0.0256), max_top1_loss = 0.0423 (good 0.0257,
  bad 0.0699) — the defaults in gate/policy.py.
Run:  .venv/bin/python scripts/derive_bounds.py --good results/compare-bf16-…-vs-fp8-…/report.json \
          --bad results/compare-bf16-…-vs-fp8_e5m2-…/report.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

CRITERIA = {"kl_excess": "max_kl_excess", "top1_loss": "max_top1_loss"}


def estimates(path: Path) -> dict[str, float]:
    """The token criteria's estimates in one report.json."""
    report = json.loads(path.read_text(encoding="utf-8"))
    out = {}
    for c in report["verdict"]["criteria"]:
        if c["name"] in CRITERIA and c.get("estimate") is not None:
            out[c["name"]] = float(c["estimate"])
    missing = set(CRITERIA) - set(out)
    if missing:
        raise SystemExit(f"{path}: no estimate for {', '.join(sorted(missing))} (teacher forcing off?)")
    return out


def derive(good: list[dict[str, float]], bad: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """{criterion: {"good": worst good, "bad": best bad, "bound": geometric mean}}."""
    result = {}
    for name in CRITERIA:
        g = max(e[name] for e in good)
        b = min(e[name] for e in bad)
        if not 0 < g < b:
            raise SystemExit(f"{name}: known-good {g:.4g} is not below known-bad {b:.4g}; no bound separates them")
        result[name] = {"good": g, "bad": b, "bound": math.sqrt(g * b)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--good", type=Path, action="append", required=True, help="report.json of a known-good compare")
    parser.add_argument("--bad", type=Path, action="append", required=True, help="report.json of a known-bad compare")
    args = parser.parse_args(argv)
    result = derive([estimates(p) for p in args.good], [estimates(p) for p in args.bad])
    for name, r in result.items():
        print(f"{CRITERIA[name]} = {r['bound']:.3g}   (known good {r['good']:.4g}, known bad {r['bad']:.4g}, "
              f"each a factor {math.sqrt(r['bad'] / r['good']):.2f} from the bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
