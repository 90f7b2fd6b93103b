"""The same `kvqual compare` run a second time judges the saved files without starting a server."""

import json

from test_compare import kvqual, report_of, setup


def test_a_finished_compare_run_again_judges_its_files_without_any_server(tmp_path, fake_server):
    base, cand = setup(tmp_path, fake_server, [], n=160, broken_share=0.03)
    first = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl")
    assert first.returncode == 0, first.stdout + first.stderr
    before = report_of(tmp_path)
    base.stop()
    cand.stop()  # nothing answers now: a second run that asked a server would end in exit 4

    again = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "judged again without starting base or cand" in again.stderr
    after = report_of(tmp_path)
    assert after["verdict"] == before["verdict"]
    assert after["suites"] == before["suites"] and after["runs"] == before["runs"]
    assert again.stdout.splitlines()[0] == first.stdout.splitlines()[0]


def test_another_policy_or_rerun_asks_the_servers_again(tmp_path, fake_server):
    base, cand = setup(tmp_path, fake_server, [], n=160, broken_share=0.03)
    first = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl")
    assert first.returncode == 0, first.stdout + first.stderr
    base.stop()
    cand.stop()
    for flags in (["--strict"], ["--rerun"], ["--max-tokens", "17"]):
        r = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl", *flags)
        assert r.returncode == 4 and "judged again" not in r.stderr, (flags, r.stdout + r.stderr)


def test_a_compare_a_budget_stopped_leaves_no_note(tmp_path, fake_server):
    setup(tmp_path, fake_server, ["--wrong-rate", "0.03"], n=600)
    r = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl", "--budget-tokens", "1")
    assert r.returncode == 3, r.stdout + r.stderr
    assert report_of(tmp_path)["verdict"]["sequential"]["stop"]
    assert not list((tmp_path / "results" / ".compares").glob("*.json"))
