"""The cache-path probe (docs/cache.md) end to end against fake prefix-caching servers: warm units
against cold ones within shared contexts, waves, cold targets, and what the gate makes of them."""

import json

import pytest

from kvtest import write_suite
from test_compare import criterion, kvqual, report_of

from kvqual.judge import cache as mx
from kvqual.config import Target
from kvqual.gate import CachePairs, GatePolicy
from kvqual.gate import criteria as cr
from kvqual.records import Item
from kvqual.plan import cache_waves

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def shared_items(docs=8, per_doc=4):
    """Completions items: `per_doc` questions on each document of 48 words (3 fake-token blocks)."""
    out = []
    for d in range(docs):
        doc = " ".join(WORDS[(d + i) % len(WORDS)] for i in range(48))
        for q in range(per_doc):
            out.append({"id": f"d{d}q{q}", "prompt": f"Document {d}: {doc}. Question {q}: [[answer={d}{q}]] A:",
                        "answer": f"{d}{q}", "scorer": "exact", "context_id": f"doc{d}",
                        "meta": {"cache_wave": 0 if q == 0 else 1}})
    return out


def setup(tmp_path, fake_server, cand_flags, base_flags=()):
    base = fake_server("--kv-cache-dtype", "bf16", *base_flags)
    cand = fake_server("--kv-cache-dtype", "bf16", *cand_flags)
    write_suite(tmp_path / "shared.jsonl", shared_items())
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.base]\nbase_url = "{base.base_url}"\nkv_cache_dtype = "bf16"\n'
        f'[targets.cand]\nbase_url = "{cand.base_url}"\nkv_cache_dtype = "bf16"\n')
    return base, cand


def test_clean_prefix_cache_passes_the_cache_path(tmp_path, fake_server):
    setup(tmp_path, fake_server, ["--prefix-cache"])
    r = kvqual(tmp_path, "compare", "base", "cand", "--suite", "shared.jsonl", "--fixed-n")
    rep = report_of(tmp_path)
    c = criterion(rep, "cache_path")
    # the waves made 3 of every 4 units warm, the first cold; the contrast is exactly 0 on a clean path
    assert "24 warm and 8 cold units" in c["detail"] and "8 contexts with warm and cold units" in c["detail"]
    assert c["status"] == "pass" and c["estimate"] == 0 and c["role"] == "guard"
    assert r.returncode in (0, 3), r.stdout + r.stderr  # 32 items cannot always show accuracy; never a FAIL
    assert "cache_path" in r.stdout and "nats/token" in r.stdout


def test_warm_hits_that_change_the_distribution_fail_the_cache_path(tmp_path, fake_server):
    setup(tmp_path, fake_server, ["--prefix-cache", "--warm-noise", "1.5"])
    r = kvqual(tmp_path, "compare", "base", "cand", "--suite", "shared.jsonl", "--fixed-n")
    c = criterion(report_of(tmp_path), "cache_path")
    assert c["status"] == "fail" and c["estimate"] > GatePolicy().max_cache_kl_excess
    assert r.returncode == 1 and "cache_path" in r.stdout, r.stdout + r.stderr


def test_a_cold_target_salts_every_request_so_nothing_hits(tmp_path, fake_server):
    base, cand = setup(tmp_path, fake_server, ["--prefix-cache"])
    toml = (tmp_path / "kvqual.toml").read_text() + "cold = true\n"  # the candidate is the cold arm now
    (tmp_path / "kvqual.toml").write_text(toml)
    kvqual(tmp_path, "compare", "base", "cand", "--suite", "shared.jsonl", "--fixed-n")
    rep = report_of(tmp_path)
    assert not [c for c in rep["verdict"]["criteria"] if c["name"] == "cache_path"]  # no warm unit, no probe suite
    cand_dir = tmp_path / "results" / rep["runs"]["candidate"]["run_id"]
    cached = [json.loads(line)["cached_tokens"] for line in (cand_dir / "samples.jsonl").read_text().splitlines()]
    assert cached and set(cached) == {0}


def test_cache_salt_is_per_request_only_for_cold_targets():
    cold, warm = Target("c", ("http://x/v1",), cold=True), Target("w", ("http://x/v1",))
    assert warm.cache_salt("run", ("s", "a", 0)) is None and "cold" not in warm.identity()
    a, b = cold.cache_salt("run", ("s", "a", 0)), cold.cache_salt("run", ("s", "a", 1))
    assert a and b and a != b and cold.identity()["cold"] is True


def test_waves_send_the_first_use_of_each_prefix_first():
    items = [Item(f"i{k}", "s", prompt="p", meta={"cache_wave": k % 2}) for k in range(6)] + [Item("plain", "s", prompt="p")]
    units = [(it, 0) for it in items]
    waves = cache_waves(units)
    assert [[u[0].id for u in w] for w in waves] == [["i0", "i2", "i4", "plain"], ["i1", "i3", "i5"]]
    assert cache_waves([(Item("x", "s", prompt="p"), 0)]) == [[(Item("x", "s", prompt="p"), 0)]]


def test_contrast_is_warm_minus_cold_within_each_context():
    # context a: warm 0.5, 0.3 vs cold 0.1 → 0.3; context b: warm 0.2 vs cold 0.2 → 0; c has no cold unit
    cp = CachePairs([0.5, 0.3, 0.1, 0.2, 0.2, 9.0], [True, True, False, True, False, True],
                    ["ctx:a", "ctx:a", "ctx:a", "ctx:b", "ctx:b", "ctx:c"], note="n")
    c = cr.cache_path(cp, GatePolicy(max_cache_kl_excess=1.0), 0.05, 8)
    assert c.estimate == pytest.approx(0.15) and c.n == 2 and c.unit == "contexts"
    # one standard error of two values 0.3 and 0: sd 0.2121 / sqrt 2 → the t bound at df 1
    assert c.ci_high == pytest.approx(0.15 + 6.3138 * 0.15, rel=1e-3)
    lone = cr.cache_path(CachePairs([0.1, 0.2], [True, False], ["ctx:a", "ctx:a"]), GatePolicy(), 0.05, 8)
    assert lone.status == "inconclusive" and "2 are needed" in lone.detail


def test_a_probe_suite_without_reported_hits_is_inconclusive_never_missing():
    class Arm:  # only what cache_pairs reads
        samples = {}
    cp = mx.cache_pairs(None, Arm(), Arm(), [("shared_prefix", "a", 0)])
    assert cp is not None and cp.role == "primary" and cp.values.size == 0
    c = cr.cache_path(cp, GatePolicy(), 0.05, 8)
    assert c.status == "inconclusive" and c.role == "primary" and "does not report cached prompt tokens" in c.detail
    assert mx.cache_pairs(None, Arm(), Arm(), [("arith", "a", 0)]) is None


def test_one_server_cold_against_warm_keeps_scoring_out_of_the_shared_cache(tmp_path, fake_server):
    # the recipe for a real server (docs/cache.md): one prefix-caching server, a cold target and a
    # warm one. Teacher forcing writes the cache (vLLM v1 does), so unsalted echoes of the cold arm
    # would make the warm arm's first uses of each prefix warm, and the probe would have no cold unit
    server = fake_server("--kv-cache-dtype", "bf16", "--prefix-cache")
    write_suite(tmp_path / "shared.jsonl", shared_items())
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.cold]\nbase_url = "{server.base_url}"\nkv_cache_dtype = "bf16"\ncold = true\n'
        f'[targets.warm]\nbase_url = "{server.base_url}"\nkv_cache_dtype = "bf16"\n')
    kvqual(tmp_path, "compare", "cold", "warm", "--suite", "shared.jsonl", "--fixed-n")
    c = criterion(report_of(tmp_path), "cache_path")
    assert "24 warm and 8 cold units" in c["detail"] and c["status"] == "pass", c
