"""Fixtures for the report tests: the sample report dict and an all-null variant."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

SAMPLE = Path(__file__).with_name("sample_report.json")


@pytest.fixture
def report() -> dict[str, Any]:
    """The sample FAIL report (every criterion status, two suites, hostile model text)."""
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


@pytest.fixture
def null_report(report: dict[str, Any]) -> dict[str, Any]:
    """The same report with everything optional null or empty, as after a crashed run."""
    r = copy.deepcopy(report)
    r.update(command=None, created_at=None, kvqual_version=None, speed=None, plots=None,
             examples=[], warnings=[], teacher_forcing={"enabled": None, "note": None}, suites={})
    r["runs"] = {"baseline": None, "candidate": None, "aa": None}
    r["verdict"] = {"verdict": "INCONCLUSIVE", "exit_code": 3, "reason": None, "policy": None,
                    "criteria": [{"name": "accuracy", "suite": None, "status": "not_evaluated",
                                  "direction": None, "bound_low": None, "bound_high": None,
                                  "estimate": None, "ci_low": None, "ci_high": None, "ci_level": None,
                                  "p_pass": None, "p_fail": None, "p_fail_holm": None, "n": 0,
                                  "n_more": None, "detail": None}]}
    return r
