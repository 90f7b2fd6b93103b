"""`kvqual compare --speed-from LOAD`: the speedup criterion judged on a `kvqual load` session's
steady-state ratio (docs/speed.md). The criterion against hand-computed values, the load.json
checks (exit 2, one line naming the file), and compares on fake servers that PASS and FAIL on it."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from kvqual.cli import main
from kvqual.errors import LoadFileError
from kvqual.gate import GateInputs, GatePolicy, SteadySpeed, decide, decide_sequence, nominal_alpha
from kvqual.gate import criteria as cr
from kvqual.load import evidence
from kvqual.load import stats as ls
from kvqual.load import summary

from kvtest import write_suite

# the example of tests/test_load.py: x̄ 11, v_x 0.5, ȳ 22, v_y 2, R̂ 2, Welch df 8
BASE, CAND = [10.0, 12.0, 11.0, 9.0, 13.0], [20.0, 24.0, 22.0, 18.0, 26.0]


# ---------------------------------------------------------------- the criterion (pure)


def test_fieller_t_is_the_test_the_interval_inverts():
    for r0 in (1.5, 1.9, 2.6):
        t, df = ls.fieller_t(BASE, CAND, r0)
        assert df == pytest.approx(8) and t == pytest.approx((22 - 11 * r0) / math.sqrt(2 + r0**2 * 0.5), rel=1e-12)
    for q in (0.05, 0.0194, 0.025):  # α, Pocock's α′ of 4 looks, a two-sided 95 %'s tail
        ci = ls.fieller_ratio_ci(BASE, CAND, 1 - 2 * q)
        crit = sps.t.isf(q, 8)
        for r0 in np.linspace(1.0, 3.0, 81):
            t, _ = ls.fieller_t(BASE, CAND, r0)
            assert (r0 < ci.low) == (t > crit) and (r0 > ci.high) == (t < -crit)
    assert ls.fieller_t([5.0, 5.0], [10.0, 10.0], 1.5) == (math.inf, None)  # neither arm varies


@pytest.mark.parametrize("bound, t, status", [
    (1.5, 5.5 / math.sqrt(3.125), "pass"),  # T = (22 − 16.5) / √(2 + 2.25·0.5) = 3.1113
    (1.9, 1.1 / math.sqrt(3.805), "inconclusive"),  # 0.5639
    (2.6, -6.6 / math.sqrt(5.38), "fail"),  # −2.8455
])
def test_steady_speedup_against_hand_computed_values(bound, t, status):
    s = SteadySpeed(np.array(BASE), np.array(CAND), "from load.json")
    c = cr.steady_speedup(s, GatePolicy(min_speedup=bound), 0.05, 8)
    assert c.name == "speedup" and c.direction == "at_least" and c.bound_low == bound and c.unit == "batches"
    assert c.estimate == 2.0 and c.n == 10 and c.level == 0.05 and c.n_more is None
    assert c.p_pass == pytest.approx(sps.t.sf(t, 8), rel=1e-9) and c.p_fail == pytest.approx(sps.t.cdf(t, 8), rel=1e-9)
    # the interval shown is Fieller's at 1 − 2α = 90 %: t(0.95, 8) = 1.859548
    tq = 1.8595480375308973
    a = 121 - tq**2 * 0.5
    root = math.sqrt(tq**2 * (242 + 242 - tq**2))
    assert c.ci_level == pytest.approx(0.9)
    assert c.ci_low == pytest.approx((242 - root) / a, rel=1e-9)
    assert c.ci_high == pytest.approx((242 + root) / a, rel=1e-9)
    assert c.ci_low == pytest.approx(1.68722, abs=1e-5) and c.ci_high == pytest.approx(2.37077, abs=1e-5)
    assert "Fieller on 5 + 5 batch means, 8.0 df" in c.detail and "from load.json" in c.detail
    assert "the same evidence at every look" in c.detail
    v = decide(GatePolicy(min_speedup=bound, looks=1), GateInputs(steady_speed=s), np.random.default_rng(0))
    assert {x.name: x.status for x in v.criteria}["speedup"] == status


def test_without_min_speedup_the_steady_ratio_is_reported_not_gated():
    s = SteadySpeed(np.array(BASE), np.array(CAND), "from x/load.json")
    c = cr.steady_speedup(s, GatePolicy(), 0.05, 8)
    assert c.status == "not_evaluated" and c.p_pass is None and c.p_fail is None and c.bound_low is None
    assert c.estimate == 2.0 and c.ci_low == pytest.approx(1.68722, abs=1e-5) and "reported only" in c.detail


def test_an_arm_of_one_batch_is_undecided_and_a_sequential_compare_sees_the_same_evidence_at_every_look():
    one = cr.steady_speedup(SteadySpeed(np.array([10.0]), np.array(CAND)), GatePolicy(min_speedup=1.5), 0.05, 8)
    assert one.status == "inconclusive" and one.p_fail is None and one.estimate == pytest.approx(2.2)
    assert "fewer than 2 batches" in one.detail
    # at 4 planned looks each look tests at Pocock's α′ = 0.0194: the 96.1 % interval, the same at every look
    s = SteadySpeed(np.array(BASE), np.array(CAND))
    v = decide_sequence(GatePolicy(min_speedup=1.9, looks=4), [(10, GateInputs(steady_speed=s)),
                                                               (20, GateInputs(steady_speed=s))], 0)
    speed = next(c for c in v.criteria if c.name == "speedup")
    ci = ls.fieller_ratio_ci(BASE, CAND, 1 - 2 * speed.level)
    assert speed.level == pytest.approx(nominal_alpha(0.05, 4)) == pytest.approx(0.0194, abs=1e-4)
    assert (speed.ci_low, speed.ci_high) == (ci.low, ci.high)
    rows = [look["criteria"]["speedup"] for look in v.to_json()["sequential"]["looks"]]
    assert len(rows) == 2 and rows[0] == rows[1]


# ---------------------------------------------------------------- load.json files


def _arm(name: str, batches: list[float], identity: dict | None, info: dict | None = None) -> dict:
    """One arm as load/summary.summarize_arm writes it (the keys the compare reads, and a server)."""
    info = info or {}
    est = ls.batch_means_ci(batches)
    return {"target": name, "identity": identity, "model": info.get("model", "fake-model"),
            "base_urls": (identity or {}).get("base_urls", []), "engine": info.get("engine"),
            "kv_cache_dtype": {"expected": (identity or {}).get("kv_cache_dtype"), "reported": info.get("kv")},
            "concurrency": 16, "window": {"start_s": 30.0, "end_s": 240.0, "warmup_s": 30.0, "batches": len(batches),
                                          "batch_s": 21.0},
            "output_tok_s": {**est.to_json(2), "batches": [round(x, 2) for x in batches]},
            "server": {"running_mean": 4.0, "waiting_mean": 3.0}, "saturated": True, "notes": []}


def _identity(name: str, url: str, dtype: str) -> dict:
    return {"name": name, "base_urls": [url], "model": None, "launch": None, "kv_cache_dtype": dtype}


def write_load(folder: Path, base: dict, cand: dict | None, status: str = "complete") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    arms = [base] + ([cand] if cand else [])
    doc = summary.document(arms, {"duration_s": 240, "concurrency": 16}, {"command": "kvqual load"}, status)
    (folder / "load.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return folder


def _config(tmp_path: Path, base_url: str, cand_url: str, extra: str = "") -> None:
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.base]\nbase_url = "{base_url}"\nkv_cache_dtype = "bf16"\n'
        f'[targets.cand]\nbase_url = "{cand_url}"\nkv_cache_dtype = "fp8_e4m3"\n' + extra, encoding="utf-8")


B_URL, C_URL = "http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"
GOOD_B, GOOD_C = [45.0, 46.0, 44.5, 47.0, 45.5, 46.5], [67.0, 66.0, 68.5, 67.5, 66.5, 68.0]


def _bad_files(tmp_path: Path) -> list[tuple[str, str]]:
    """(what --speed-from is given, what the one line must say after its path)."""
    ib, ic = _identity("base", B_URL, "bf16"), _identity("cand", C_URL, "fp8_e4m3")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"verdict": {}}', encoding="utf-8")
    write_load(tmp_path / "partial", _arm("base", GOOD_B, ib), None, "partial")
    write_load(tmp_path / "failed", _arm("base", GOOD_B, ib), _arm("cand", GOOD_C, ic), "failed")
    write_load(tmp_path / "swapped", _arm("cand", GOOD_C, ic), _arm("base", GOOD_B, ib))
    write_load(tmp_path / "elsewhere", _arm("base", GOOD_B, _identity("base", "http://10.0.0.1:8000/v1", "bf16")),
               _arm("cand", GOOD_C, ic))
    edited = write_load(tmp_path / "edited", _arm("base", GOOD_B, ib), _arm("cand", GOOD_C, ic)) / "load.json"
    doc = json.loads(edited.read_text())
    doc["ratio"]["estimate"] = 2.5
    edited.write_text(json.dumps(doc))
    return [
        ("nope/load.json", "nope/load.json: no such file"),
        ("empty", "empty: holds no load.json"),
        ("broken.json", "broken.json: not valid JSON"),
        ("other.json", "other.json: not a kvqual load.json"),
        ("partial", "partial/load.json: holds no ratio (status 'partial', 1 target(s) measured"),
        ("failed", "failed/load.json: the load failed"),
        ("swapped", "swapped/load.json: measured cand (baseline) vs base, this compare is base vs cand, "
                    "the other way round"),
        ("elsewhere", "elsewhere/load.json: base was measured with base_urls ['http://10.0.0.1:8000/v1'], the config "
                      "now says ['http://127.0.0.1:9/v1']"),
        ("edited", "edited/load.json: not a complete load.json: ratio.estimate 2.5 is not the arms' batch "
                   "means' ratio"),
    ]


def test_a_bad_load_json_is_exit_2_with_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """Every refusal comes before a request is sent (the targets' ports are closed): from the
    option, from KVQUAL_SPEED_FROM, and from `[run] speed_from`."""
    monkeypatch.chdir(tmp_path)
    _config(tmp_path, B_URL, C_URL)
    write_suite(tmp_path / "s.jsonl", [{"id": "a", "prompt": "x"}])
    for given, message in _bad_files(tmp_path):
        code = main(["compare", "base", "cand", "--suite", "s.jsonl", "--speed-from", given])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"kvqual: error: {message}"), (given, err)
    assert not (tmp_path / "results").exists()
    monkeypatch.setenv("KVQUAL_SPEED_FROM", "swapped")
    assert main(["compare", "base", "cand", "--suite", "s.jsonl"]) == 2
    assert "swapped/load.json: measured cand (baseline)" in capsys.readouterr().err
    monkeypatch.delenv("KVQUAL_SPEED_FROM")
    _config(tmp_path, B_URL, C_URL, '[run]\nspeed_from = "partial"\n')
    assert main(["compare", "base", "cand", "--suite", "s.jsonl"]) == 2
    assert "partial/load.json: holds no ratio" in capsys.readouterr().err


def test_what_the_servers_served_must_be_what_the_load_measured(tmp_path):
    ib, ic = _identity("base", B_URL, "bf16"), _identity("cand", C_URL, "fp8_e4m3")
    e = evidence.read(write_load(tmp_path / "l", _arm("base", GOOD_B, ib, {"kv": "bf16", "engine": "vllm"}),
                                 _arm("cand", GOOD_C, ic, {"kv": "fp8_e4m3", "engine": "vllm"})))

    def run(target, url, dtype, model="fake-model", reported=None, engine="vllm"):
        return SimpleNamespace(target=target, model=model, kv_cache_dtype=dtype, base_urls=(url,),
                               server_info={"kv_cache_dtype": reported or dtype, "engine": engine})

    e.check_served(run("base", B_URL, "bf16"), run("cand", C_URL, "fp8_e4m3"))
    for cand, words in [(run("cand", C_URL, "fp8_e4m3", model="other"), "cand was measured with model 'fake-model'"),
                        (run("cand", C_URL, "fp8_e4m3", reported="fp8_e5m2"), "the reported KV dtype 'fp8_e4m3'"),
                        (run("cand", C_URL, "fp8_e4m3", engine="sglang"), "engine 'vllm'"),
                        (run("cand", "http://127.0.0.1:11/v1", "fp8_e4m3"), "base_urls")]:
        with pytest.raises(LoadFileError, match=words) as exc:
            e.check_served(run("base", B_URL, "bf16"), cand)
        assert str(exc.value).startswith(f"{tmp_path / 'l' / 'load.json'}: ")


# ---------------------------------------------------------------- compares on fake servers

REPORT_DOC = Path(__file__).resolve().parents[1] / "docs" / "report-json.md"


def _paths(node: dict, where: str = "steady_speed") -> set[str]:
    """Every key path of report.json's steady_speed, `<arm>` for the two arms (docs/report-json.md)."""
    out = {where}
    for key, child in node.items():
        name = f"{where}.{'<arm>' if where.endswith('.arms') else key}"
        out |= _paths(child, name) if isinstance(child, dict) else {name}
    return out


def _compare(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    code = main(["compare", "base", "cand", "--suite", "s.jsonl", "--fixed-n", *args])
    path, = (tmp_path / "results").glob("compare-*/report.json")
    return code, json.loads(path.read_text()), path


def test_compare_gates_speedup_on_the_load_json(tmp_path, fake_server, capsys, monkeypatch):
    """Identical quality on both fakes; the speedup criterion reads a load.json of those two servers:
    reported without min_speedup, PASS at 1.47× over min_speedup 1.3, FAIL at 0.9×; the answers
    overlap with the A/A replicate and teacher forcing (speed is not measured on them)."""
    from kvqual import probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CI", "true")
    base = fake_server("--kv-cache-dtype", "bf16")
    cand = fake_server("--kv-cache-dtype", "fp8_e4m3")
    # 120 prompts bound the share of broken ones at 4%, not the default 1% (gate/tail.py): the subject is speed
    _config(tmp_path, base.base_url, cand.base_url, "[gate]\nmax_broken_share = 0.04\n")
    (tmp_path / "gated.toml").write_text((tmp_path / "kvqual.toml").read_text() + "min_speedup = 1.3\n")
    write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Question {i}: [[answer={i}]] A:", "answer": str(i),
                                        "scorer": "exact"} for i in range(120)])
    info = {name: asyncio.run(probe.describe(s.base_url, "")) for name, s in (("base", base), ("cand", cand))}
    def arm(name, server, dtype, batches):  # as `kvqual load base cand` against these two servers writes it
        return _arm(name, batches, _identity(name, server.base_url, dtype), {
            "model": info[name]["models"][0], "kv": info[name]["kv_cache_dtype"], "engine": info[name]["engine"]})

    arms = {"base": lambda b: arm("base", base, "bf16", b), "cand": lambda b: arm("cand", cand, "fp8_e4m3", b)}
    faster = write_load(tmp_path / "load-fast", arms["base"](GOOD_B), arms["cand"](GOOD_C))
    slower = write_load(tmp_path / "load-slow", arms["base"](GOOD_B), arms["cand"]([x * 0.9 for x in GOOD_B]))

    code, rep, path = _compare(tmp_path, "--speed-from", str(faster))
    out = capsys.readouterr().out
    assert code == 0, out
    speed = next(c for c in rep["verdict"]["criteria"] if c["name"] == "speedup")
    assert speed["status"] == "not_evaluated" and "reported only" in speed["detail"]
    assert speed["estimate"] == pytest.approx(67.25 / 45.75, abs=1e-3)
    assert rep["verdict"]["sequential"]["overlap"] is True  # nothing measures speed on the answers
    steady = rep["steady_speed"]
    assert steady["source"] == str(faster / "load.json") and steady["concurrency"] == 16
    assert steady["ratio"]["estimate"] == pytest.approx(1.4699, abs=1e-4)
    assert "steady speed at saturation" in out
    documented = {line.split("`")[1] for line in REPORT_DOC.read_text(encoding="utf-8").splitlines()
                  if line.startswith("| `steady_speed")}
    assert _paths(steady) == documented

    code, rep, _ = _compare(tmp_path, "--config", "gated.toml", "--speed-from", str(faster / "load.json"))
    out = capsys.readouterr().out
    speed = next(c for c in rep["verdict"]["criteria"] if c["name"] == "speedup")
    assert code == 0 and rep["verdict"]["verdict"] == "PASS", out
    assert speed["status"] == "pass" and speed["role"] == "primary" and speed["bound_low"] == 1.3
    want = ls.fieller_ratio_ci(GOOD_B, GOOD_C, 0.9)
    assert (speed["ci_low"], speed["ci_high"]) == pytest.approx((want.low, want.high)) and speed["ci_low"] > 1.3
    where = f"from {faster / 'load.json'} (kvqual load at concurrency 16; steady windows base 30–240 s"
    assert where in speed["detail"]
    assert rep["verdict"]["sequential"]["overlap"] is True

    code, rep, _ = _compare(tmp_path, "--config", "gated.toml", "--speed-from", str(slower))
    out = capsys.readouterr().out
    speed = next(c for c in rep["verdict"]["criteria"] if c["name"] == "speedup")
    assert code == 1 and rep["verdict"]["verdict"] == "FAIL" and speed["status"] == "fail", out
    assert speed["estimate"] == pytest.approx(0.9, abs=1e-3) and "speedup" in rep["verdict"]["reason"]
    assert rep["speed"]["slower"] == ("the candidate is slower: 0.90× the baseline's steady-state output tok/s at "
                                      f"saturation [0.88, 0.92] ({slower / 'load.json'}); gated by min_speedup 1.3")

    # `kvqual report` re-judges the same way from the saved runs
    runs = rep["runs"]
    code = main(["report", f"results/{runs['baseline']['run_id']}", f"results/{runs['candidate']['run_id']}",
                 "--config", "gated.toml", "--fixed-n", "--speed-from", str(slower), "--out", "again"])
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert code == 1 and next(c for c in again["verdict"]["criteria"] if c["name"] == "speedup") == speed
