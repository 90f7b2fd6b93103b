"""scripts/derive_bounds.py: the geometric-mean procedure behind the default token bounds."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "derive_bounds", Path(__file__).resolve().parents[1] / "scripts" / "derive_bounds.py")
derive_bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_bounds)


def _report(tmp_path, name, kl, top1):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"verdict": {"criteria": [
        {"name": "kl_excess", "estimate": kl}, {"name": "top1_loss", "estimate": top1},
        {"name": "accuracy_pooled", "estimate": -0.01}]}}))
    return path


def test_bound_is_the_geometric_mean_of_worst_good_and_best_bad(tmp_path, capsys):
    good = [_report(tmp_path, "g1", 0.004, 0.02), _report(tmp_path, "g2", 0.006, 0.01)]
    bad = [_report(tmp_path, "b1", 0.03, 0.08), _report(tmp_path, "b2", 0.05, 0.07)]
    assert derive_bounds.main(sum((["--good", str(p)] for p in good), []) + sum((["--bad", str(p)] for p in bad), [])) == 0
    out = capsys.readouterr().out
    assert f"max_kl_excess = {math.sqrt(0.006 * 0.03):.3g}" in out
    assert f"max_top1_loss = {math.sqrt(0.02 * 0.07):.3g}" in out


def test_overlapping_good_and_bad_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="no bound separates them"):
        derive_bounds.main(["--good", str(_report(tmp_path, "g", 0.05, 0.02)),
                            "--bad", str(_report(tmp_path, "b", 0.03, 0.08))])
