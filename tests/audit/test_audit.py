"""`kvqual audit` end to end against fake servers on loopback (tests/fakeserver.py speaks token ids)."""

import json
import os
import subprocess
import sys

import pytest


def kvqual(tmp_path, *args):
    env = {**os.environ, "CI": "true"}
    return subprocess.run([sys.executable, "-m", "kvqual", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def outputs(path, n, completion=lambda i: f" {i}", **extra):
    """n outputs as the fake server would generate them (its answer to "[[answer=i]]" is " i")."""
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"o{i}", "prompt": f"Question {i}: [[answer={i}]] A:", "completion": completion(i),
                                 "max_tokens": 16, "category": "even" if i % 2 else "odd", **extra}) + "\n")
    return path


def setup(tmp_path, fake_server, *cand_flags):
    ref = fake_server("--token-ids", "--kv-cache-dtype", "bf16")
    toml = f'[targets.ref]\nbase_url = "{ref.base_url}"\nkv_cache_dtype = "bf16"\n'
    if cand_flags:
        cand = fake_server("--token-ids", "--kv-cache-dtype", "fp8_e4m3", *cand_flags)
        toml += f'[targets.cand]\nbase_url = "{cand.base_url}"\nkv_cache_dtype = "fp8_e4m3"\n'
    (tmp_path / "kvqual.toml").write_text(toml)


def report_of(tmp_path):
    path, = (tmp_path / "results").glob("audit-*/report.json")
    return json.loads(path.read_text())


def widest_top(path):
    """The most top logprobs any scored position of a teacher file holds."""
    from kvqual.forced import load_forced

    return max(len(top) for f in load_forced(path, logprobs=True).values() for top in f.logprobs.top_logprobs)


def criterion(report, name):
    return next(c for c in report["verdict"]["criteria"] if c["name"] == name)


def test_outputs_the_reference_would_give_pass_and_a_clean_sample_stops_at_the_first_look(tmp_path, fake_server):
    setup(tmp_path, fake_server)
    outputs(tmp_path / "out.jsonl", 300)
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("PASS")
    rep = report_of(tmp_path)
    assert rep["sequential"]["sizes"] == [124] and rep["sequential"]["planned"] == [124, 300]
    assert criterion(rep, "kl_excess")["status"] == "not_evaluated"
    assert "no candidate server" in criterion(rep, "kl_excess")["detail"]
    assert criterion(rep, "top1_loss")["status"] == "pass"
    assert criterion(rep, "length_ratio")["estimate"] == pytest.approx(1.0)
    f = rep["figures"]
    assert f["units"] == 124 and f["scored"] == 124 and f["tokens_scored"] > 124
    assert rep["outputs"]["lines"] == 300 and rep["outputs"]["strata"] == {"category:odd": 150, "category:even": 150}
    assert f["mean_logprob"]["difference"]["estimate"] == pytest.approx(0.0)
    assert len(f["most_drifted"]) == 10 and f["most_drifted"][0]["line"] is not None
    floor = tmp_path / "results" / rep["floor_run"]
    assert (floor / "manifest.json").exists()  # the floor is a run like any other
    # without a candidate every pass asks top-1 only: what top-1 loss and the mean log-probability read
    assert json.loads((floor / "manifest.json").read_text())["params"]["top_logprobs"] == 1
    audit_dir, = (tmp_path / "results").glob("audit-*")
    assert widest_top(audit_dir / "forced-reference.jsonl") <= 2  # top-1, and the token itself where it is not
    floor_forced, = floor.glob("teacher-*.jsonl")
    assert widest_top(floor_forced) <= 2
    assert list((tmp_path / "results").glob("audit-*/report.md"))


def test_a_budget_stops_an_undecided_audit_before_a_look_it_cannot_afford(tmp_path, fake_server):
    """`--max-minutes`: after an undecided first look the next is priced (plan.next_round_time) and, past
    the budget, not taken; the report names the budget. Without one the same audit goes on to the next look."""
    setup(tmp_path, fake_server)
    outputs(tmp_path / "out.jsonl", 300, completion=lambda i: f" {i} {i}" if i % 8 == 0 else f" {i}")
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref", "--max-minutes", "0.001")
    assert r.returncode == 3, r.stdout + r.stderr
    rep = report_of(tmp_path)
    assert rep["sequential"]["sizes"] == [124], rep["sequential"]
    assert "stopped before look 2 (300 outputs)" in rep["sequential"]["stop"] and "--max-minutes" in rep["sequential"]["stop"]
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref", "--max-minutes", "0")
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    assert report_of(tmp_path)["sequential"]["sizes"] == [124, 300]


def test_outputs_three_times_longer_fail_on_length(tmp_path, fake_server):
    setup(tmp_path, fake_server)
    outputs(tmp_path / "out.jsonl", 130, completion=lambda i: f" {i} {i} {i}")
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = report_of(tmp_path)
    assert rep["verdict"]["verdict"] == "FAIL" and criterion(rep, "length_ratio")["status"] == "fail"


def test_a_candidate_whose_distributions_moved_fails_on_kl(tmp_path, fake_server):
    setup(tmp_path, fake_server, "--logprob-noise", "0.6")
    outputs(tmp_path / "out.jsonl", 130)
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref", "--candidate", "cand")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = report_of(tmp_path)
    kl = criterion(rep, "kl_excess")
    assert kl["status"] == "fail" and kl["estimate"] > 0.012
    assert rep["figures"]["candidate"]["floor"] == "reproduced bit for bit"
    audit_dir, = (tmp_path / "results").glob("audit-*")
    for scorer in ("reference", "candidate", "reference-again"):  # KL reads the top-k of both
        assert widest_top(audit_dir / f"forced-{scorer}.jsonl") >= 5


@pytest.mark.parametrize("lines, args, words", [
    ([{"prompt": "p", "completion": "c", "max_tokens": 8}, {"prompt": "p"}], (), "out.jsonl:2: no completion"),
    ([{"prompt": "p", "completion": "c"}], (), "line 1 of the outputs does not say the max_tokens"),
    ([{"custom_id": "r", "response": {"status_code": 200, "body": {"choices": [{"text": "x"}]}}}], (),
     "--batch-input"),
    ([{"prompt": "p", "completion": "c", "max_tokens": 8}], ("--against", "nosuch"), "nosuch"),
    ([{"prompt": "p", "completion": "c", "max_tokens": 8}], ("--against", "ref", "--suite", "x.jsonl"),
     "--suite does not apply to kvqual audit"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_request(tmp_path, fake_server, lines, args, words):
    setup(tmp_path, fake_server)
    (tmp_path / "out.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = kvqual(tmp_path, "audit", "out.jsonl", *(args or ("--against", "ref")))
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list((tmp_path / "results").glob("audit-*")) if (tmp_path / "results").exists() else True


def test_a_forcing_pass_reports_its_progress(capsys):
    from kvqual.audit.flow import Ticker

    tick = Ticker("teacher forcing the audited outputs on bf16", 3, every=0.0)
    for _ in range(3):
        tick()
    err = capsys.readouterr().err
    assert "teacher forcing the audited outputs on bf16: 3/3 scored" in err
    quiet = Ticker("x", 3, every=3600)
    quiet()
    assert "x:" not in capsys.readouterr().err


def test_outputs_of_the_same_prompts_in_another_file_reuse_the_floor(tmp_path, fake_server):
    """The floor depends on the prompts alone: another config's outputs of the same prompts, in another
    order, are judged against the same floor run (not generated again)."""
    setup(tmp_path, fake_server)
    outputs(tmp_path / "a.jsonl", 130)
    outputs(tmp_path / "b.jsonl", 130, completion=lambda i: f" {i} {i}")
    lines = (tmp_path / "b.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "b.jsonl").write_text("".join(reversed(lines)))
    floors = []
    for name in ("a.jsonl", "b.jsonl"):
        r = kvqual(tmp_path, "audit", name, "--against", "ref")
        assert r.returncode in (0, 1), r.stdout + r.stderr
        path, = (tmp_path / "results").glob(f"audit-{name.split('.')[0]}-*/report.json")
        floors.append(json.loads(path.read_text())["floor_run"])
    assert floors[0] == floors[1]
    assert len(list((tmp_path / "results").glob("ref-*/manifest.json"))) == 1


def test_a_reference_without_tokenize_scores_the_outputs_by_text_alignment_and_says_how_many(tmp_path, fake_server):
    """Issue 53: audit needed /tokenize and exited 4 on a server without it, where compare aligns by text."""
    ref = fake_server("--kv-cache-dtype", "bf16")  # no --token-ids: no /tokenize
    (tmp_path / "kvqual.toml").write_text(f'[targets.ref]\nbase_url = "{ref.base_url}"\nkv_cache_dtype = "bf16"\n')
    outputs(tmp_path / "out.jsonl", 130)
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "ref")
    assert r.returncode == 0, r.stdout + r.stderr
    f = report_of(tmp_path)["figures"]
    assert f["aligned_by_text"] == f["units"] == f["scored"] == 130 and f["tokens_scored"] >= 130, f
    assert "130 of them aligned by text (ref gave no token ids" in r.stdout
    assert criterion(report_of(tmp_path), "length_ratio")["estimate"] == pytest.approx(1.0)


def test_audit_help_says_what_max_tokens_does_there():
    """Issue 53: the shared help said --max-tokens defaults to 256; audit takes the file's, or needs it."""
    r = subprocess.run([sys.executable, "-m", "kvqual", "audit", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(r.stdout.split())
    assert "for lines that do not state it" in text and "default 256" not in text.split("--max-tokens", 1)[1][:300]
