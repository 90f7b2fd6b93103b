"""`kvqual calibrate` end to end against fake servers on loopback (issue 51's acceptance): a base, a
known-good with small drift, a known-bad with large drift and −8 points of accuracy; then a compare
under the calibrated margins of a candidate exactly 5 points down, which stops on its margin."""

import hashlib
import json
import os
import subprocess
import sys
import tomllib

from kvtest import write_suite

N = 200


def prompt(i: int) -> str:
    return f"Question {i}: [[answer={i}]] A:"


def items(n: int) -> list[dict]:
    return [{"id": f"q{i}", "prompt": prompt(i), "answer": str(i), "scorer": "exact"} for i in range(n)]


def wrong_rate_for(k: int, n: int = N) -> str:
    """The fake's --wrong-rate that makes exactly k of the n prompts wrong (it answers "wrong" where
    sha256("wrong:" + prompt) < rate: tests/fakeserver.py), so "5 points down" is exact, not a draw."""
    hs = sorted(int.from_bytes(hashlib.sha256(("wrong:" + prompt(i)).encode()).digest()[:8], "big") / 2**64
                for i in range(n))
    return repr((hs[k - 1] + hs[k]) / 2)


def kvqual(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "kvqual", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "CI": "true"}, timeout=300)


def targets(**servers) -> str:
    dtypes = {"base": "bf16", "good": "fp8_e4m3", "bad": "fp8_e5m2", "cand": "fp8_e4m3", "twin": "fp8_e4m3"}
    return "".join(f'[targets.{name}]\nbase_url = "{s.base_url}"\nkv_cache_dtype = "{dtypes[name]}"\n'
                   for name, s in servers.items())


def start(fake_server):
    return {"base": fake_server("--kv-cache-dtype", "bf16"),
            "good": fake_server("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.02", "--top1-flip", "0.01"),
            "bad": fake_server("--kv-cache-dtype", "fp8_e5m2", "--logprob-noise", "0.6", "--top1-flip", "0.15",
                               "--wrong-rate", wrong_rate_for(16))}


def test_calibrate_writes_margins_with_provenance_and_a_candidate_on_its_margin_says_so(tmp_path, fake_server):
    servers = start(fake_server)
    servers["cand"] = fake_server("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.02", "--top1-flip", "0.01",
                                  "--wrong-rate", wrong_rate_for(10))
    write_suite(tmp_path / "s.jsonl", items(N))
    (tmp_path / "kvqual.toml").write_text(targets(**servers))
    r = kvqual(tmp_path, "calibrate", "base", "--good", "good", "--bad", "bad", "--suite", "s.jsonl",
               "--out", "margins.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "margins.toml").read_text()
    gate = tomllib.loads(text)["gate"]
    prov = gate["provenance"]
    # M1 is the known-bad's lower bound; the margin half of it; both configs' intervals recorded
    for name, field in (("kl_excess", "max_kl_excess"), ("top1_loss", "max_top1_loss")):
        m = prov[name]
        assert m["m1"] == m["bad"][1] and gate[field] == m["margin"] == float(f"{0.5 * m['m1']:.4g}")
        assert m["good"][2] < m["bad"][1]  # separated, or calibrate would have refused
    assert prov["items"] == N and prov["fraction"] == 0.5 and prov["ci_level"] == 0.9
    assert prov["baseline"] == {"target": "base", "model": "fake-model", "kv_cache_dtype": "bf16"}
    assert prov["bad"]["kv_cache_dtype"] == "fp8_e5m2" and prov["suites"][0].startswith("s:")
    assert prov["accuracy"]["bad"][0] == -0.08  # the known-bad's independent evidence: −8 points
    assert prov["kvqual_version"] and prov["created_at"].endswith("Z")

    # the config accepts the table; a compare under it names where each bound came from
    # (the share of broken prompts at what this 200-item suite can bound, 3%: the default 1% takes ~400 prompts)
    with open(tmp_path / "kvqual.toml", "a") as fh:
        fh.write("\n" + text.replace("[gate]\n", "[gate]\nmax_broken_share = 0.03\n", 1))
    r = kvqual(tmp_path, "compare", "base", "cand", "--suite", "s.jsonl")
    assert r.returncode == 3, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("INCONCLUSIVE: on its margin: accuracy_pooled ")  # 6 of the first 124 wrong: −4.84
    assert "holds its bound -5.00 points" in first and "no feasible new compare" in first
    report = json.loads(next((tmp_path / "results").glob("compare-*-vs-cand-*/report.json")).read_text())
    bounds = report["provenance"]["bounds"]
    assert bounds["max_kl_excess"]["source"] == "calibrate" and bounds["max_kl_excess"]["value"] == gate["max_kl_excess"]
    assert bounds["accuracy_margin"]["source"] == "built-in"
    assert report["provenance"]["calibration"]["items"] == N
    margin = report["verdict"]["on_margin"]
    assert margin["look"] == 1 and margin["items"] == 124 and margin["final_items"] == N and margin["power"] < 0.1
    # no report advises more items than the pool holds
    assert all(c["n_more"] is None for c in report["verdict"]["criteria"])
    md = next((tmp_path / "results").glob("compare-*-vs-cand-*/report.md")).read_text()
    assert "more items" not in md and "on its margin" in md.lower()


def test_overlapping_good_and_bad_are_refused_with_what_would_separate_them(tmp_path, fake_server):
    """A "known-bad" barely worse than the known-good: the intervals overlap on 200 items; calibrate
    refuses in one line, exit 3 (more items would decide), and says how many."""
    servers = start(fake_server)
    servers["twin"] = fake_server("--kv-cache-dtype", "fp8_e4m3", "--logprob-noise", "0.03", "--top1-flip", "0.015")
    write_suite(tmp_path / "s.jsonl", items(N))
    (tmp_path / "kvqual.toml").write_text(targets(**servers))
    r = kvqual(tmp_path, "calibrate", "base", "--good", "good", "--bad", "twin", "--suite", "s.jsonl")
    assert r.returncode == 3, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "overlaps known-bad" in last and "would separate them" in last and r.stdout == ""


def test_a_bad_that_is_not_worse_is_bad_input(tmp_path, fake_server):
    """Good and bad swapped: no number of items separates them: exit 2."""
    servers = start(fake_server)
    write_suite(tmp_path / "s.jsonl", items(N))
    (tmp_path / "kvqual.toml").write_text(targets(**servers))
    r = kvqual(tmp_path, "calibrate", "base", "--good", "bad", "--bad", "good", "--suite", "s.jsonl")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no number of items separates them" in r.stderr
