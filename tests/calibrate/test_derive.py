"""calibrate/derive.py and gate/origin.py: M1, the margin, the refusals, the `[gate]` table and its
validation, each against numbers worked by hand."""

import tomllib

import pytest

from kvqual.calibrate.derive import derive_margin, gate_table, items_to_separate
from kvqual.errors import CalibrationError, CalibrationUndecided, ConfigError
from kvqual.gate import GatePolicy
from kvqual.gate.origin import BUILTIN_DERIVED, Calibration, bound_origin, bounds_provenance

GOOD, BAD = (0.004, 0.002, 0.009), (0.05, 0.03, 0.08)


def _calibration() -> Calibration:
    kl = derive_margin("kl_excess", GOOD, BAD, 0.5, 200)
    top1 = derive_margin("top1_loss", (0.01, 0.0, 0.03), (0.16, 0.12, 0.23), 0.5, 200)
    return Calibration("kvqual calibrate b --good g --bad x", "2026-12-08T00:00:00Z", "0.1.0", 0.5, 0.9, 200,
                       ("s:abc",), {"target": "b", "model": "m", "engine": "vllm", "kv_cache_dtype": "bf16"},
                       {"target": "g", "model": "m", "kv_cache_dtype": "fp8_e4m3"},
                       {"target": "x", "model": "m", "kv_cache_dtype": "fp8_e5m2"}, kl, top1,
                       {"good": (0.0, -0.01, 0.01), "bad": (-0.08, -0.12, -0.04)})


def test_m1_is_the_bad_lower_bound_and_the_margin_half_of_it() -> None:
    m = derive_margin("kl_excess", GOOD, BAD, 0.5, 200)
    assert m.m1 == 0.03 and m.margin == 0.015 and m.good == GOOD and m.bad == BAD


def test_overlap_with_ordered_estimates_is_undecided_and_says_how_many_items() -> None:
    good, bad = (0.01, 0.005, 0.03), (0.04, 0.02, 0.07)  # widths 0.02 + 0.02 over a gap of 0.03
    assert items_to_separate(good, bad, 100) == 178  # 100 · (0.04 / 0.03)² = 177.8
    with pytest.raises(CalibrationUndecided, match="about 178 items") as err:
        derive_margin("kl_excess", good, bad, 0.5, 100)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)


def test_a_bad_not_worse_than_the_good_is_bad_input() -> None:
    with pytest.raises(CalibrationError, match="no number of items separates them") as err:
        derive_margin("top1_loss", BAD, GOOD, 0.5, 100)
    assert err.value.exit_code == 2 and not isinstance(err.value, CalibrationUndecided)


def test_the_table_round_trips_through_the_config_and_names_its_origin() -> None:
    cal = _calibration()
    data = tomllib.loads(gate_table(cal, ["a note"]))
    policy = GatePolicy.from_mapping(data["gate"], "kvqual.toml")
    assert policy.max_kl_excess == 0.015 and policy.provenance == cal
    origin = bound_origin(policy, "max_kl_excess")
    assert origin["source"] == "calibrate" and origin["range"] == [0.015, 0.04]
    assert origin["text"].startswith("calibrated 2026-12-08 on m at 200 items: 0.5 × M1, M1 = 0.03")
    # a bound edited by hand after calibrating no longer claims the calibration
    edited = GatePolicy.from_mapping({**data["gate"], "max_kl_excess": 0.02}, "kvqual.toml")
    assert bound_origin(edited, "max_kl_excess")["source"] == "kvqual.toml"
    assert bounds_provenance(policy)["calibration"]["items"] == 200


def test_an_unknown_key_anywhere_in_the_provenance_is_an_error() -> None:
    gate = tomllib.loads(gate_table(_calibration()))["gate"]
    for where in ("provenance", "kl_excess", "baseline"):
        bad = {**gate, "provenance": {**gate["provenance"]}}
        table = bad["provenance"] if where == "provenance" else {**bad["provenance"][where]}
        table["surprise"] = 1
        if where != "provenance":
            bad["provenance"][where] = table
        with pytest.raises(ConfigError, match="surprise: unknown key"):
            GatePolicy.from_mapping(bad, "kvqual.toml")


def test_the_built_in_token_bounds_say_how_they_were_derived_and_how_precise_they_are() -> None:
    p = bounds_provenance(GatePolicy())["bounds"]
    assert p["max_kl_excess"]["text"] == "built-in default, derived on SmolLM2-135M at 124 items, −13%/+15%"
    assert p["max_top1_loss"]["range"] == [0.032, 0.056] and p["accuracy_margin"]["range"] is None
    low, high, _ = BUILTIN_DERIVED["max_kl_excess"]
    assert low < GatePolicy().max_kl_excess < high
