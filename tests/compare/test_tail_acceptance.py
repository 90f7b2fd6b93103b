"""Issue 50's acceptance, end to end: `kvqual compare` against fake servers with the GPU pattern (2% of
prompts jittered by their batches), 1,000 arithmetic items. A candidate that answers NaN logprobs on 3%
of prompts and one that breaks 3% of prompts badly FAIL (exit 1, never exit 4, never PASS); an
unchanged config and a working fp8 (a small drift on every prompt) PASS (exit 0)."""

import json
import os
import subprocess
import sys

import pytest

from kvtest import write_config, write_suite

N = 1000


def arithmetic(n: int) -> list[dict]:
    return [{"id": f"a{i}", "prompt": f"Compute {i} + {i % 7}: [[answer={i + i % 7}]] =", "answer": str(i + i % 7),
             "scorer": "exact", "category": "arith"} for i in range(n)]


def compare(tmp_path, fake_server, *cand_flags: str):
    base = fake_server("--kv-cache-dtype", "bf16", "--gpu-noise", "0.02", "--noise-seed", "1")
    cand = fake_server("--kv-cache-dtype", "fp8_e4m3", "--gpu-noise", "0.02", "--noise-seed", "2", *cand_flags)
    write_suite(tmp_path / "arith.jsonl", arithmetic(N))
    write_config(tmp_path / "kvqual.toml", {"base": base.base_url, "cand": cand.base_url})
    text = (tmp_path / "kvqual.toml").read_text()
    text = text.replace(f'base_url = "{base.base_url}"\n', f'base_url = "{base.base_url}"\nkv_cache_dtype = "bf16"\n')
    text = text.replace(f'base_url = "{cand.base_url}"\n', f'base_url = "{cand.base_url}"\nkv_cache_dtype = "fp8_e4m3"\n')
    (tmp_path / "kvqual.toml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "kvqual", "compare", "base", "cand", "--suite", "arith.jsonl"],
                       cwd=tmp_path, env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=600)
    path, = (tmp_path / "results").glob("compare-*/report.json")
    return r, json.loads(path.read_text())


def criterion(report, name):
    return next(c for c in report["verdict"]["criteria"] if c["name"] == name)


def test_nan_logprobs_on_three_percent_of_prompts_fail_the_candidate(tmp_path, fake_server):
    r, rep = compare(tmp_path, fake_server, "--nan-rate", "0.03")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken_share" in rep["verdict"]["reason"]
    tail = rep["tail"]
    assert tail["unusable_count"] > 0 and all("not a" in u["error"] or "malformed" in u["error"] for u in tail["unusable"])
    assert criterion(rep, "failed_rate_candidate")["status"] == "pass"  # the candidate's own outcome, not the network's
    assert "not data" in r.stdout  # the console names them


def test_three_percent_of_prompts_broken_badly_fail_the_candidate(tmp_path, fake_server):
    # the fake picks prompts by a hash: 4.5% of them asked for, so that ~3% of these 1,000 are broken
    r, rep = compare(tmp_path, fake_server, "--broken-rate", "0.045", "--broken-noise", "3")
    assert 25 <= rep["tail"]["broken"] <= 40, rep["tail"]["broken"]  # the scenario: ~3% of prompts broken
    assert r.returncode == 1, r.stdout + r.stderr
    assert "broken_share" in rep["verdict"]["reason"]
    worst = rep["tail"]["worst"]
    assert worst and worst[0]["broken"] and worst[0]["kl"] > 0.1
    assert "worst:" in r.stdout  # which prompts broke, by id, in the console


@pytest.mark.parametrize("flags", [(), ("--logprob-noise", "0.02")], ids=["unchanged", "working-fp8"])
def test_an_unchanged_config_and_a_working_fp8_pass(tmp_path, fake_server, flags):
    r, rep = compare(tmp_path, fake_server, *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    share = criterion(rep, "broken_share")
    assert share["status"] == "pass" and share["ci_high"] < 0.01
    # a PASS rests on a sample that bounds the tail: not before ~400 independent prompts
    assert rep["verdict"]["sequential"]["sizes"][len(rep["verdict"]["sequential"]["looks"]) - 1] >= 397
