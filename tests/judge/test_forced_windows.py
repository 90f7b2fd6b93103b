"""A pair scored in different windows on the two servers (their prompt limits differ) is not
compared: its tokens saw different context. It is left out with that reason; and a compare gives
every scoring server the same limit, so that both arms score the same windows."""

import pytest

from kvqual.judge import arms as mx
from kvqual.judge.teacher import forced_pairs
from kvqual.forced import Forced
from kvqual.records import TokenLogprobs

LP = TokenLogprobs(tokens=("a", "b", "c", "d"), token_logprobs=(-0.1, -0.2, -0.3, -0.4),
                   top_logprobs=({"a": -0.1, "x": -2.0}, {"b": -0.2, "y": -1.9}, {"c": -0.3, "z": -1.5},
                                 {"d": -0.4, "w": -1.2}))
WINDOWS = {"max_prompt": 160, "windows": [[0, 0, 2], [1, 2, 4]]}


def _forcing(chunks_by_id: dict) -> mx.Forcing:
    return mx.Forcing({("s", i, 0): Forced("s", i, 0, True, None, LP, "ids", chunks) for i, chunks in chunks_by_id.items()})


def test_only_pairs_scored_in_the_same_windows_are_compared() -> None:
    base = _forcing({"one": None, "both": WINDOWS, "mixed": None})
    cand = _forcing({"one": None, "both": WINDOWS, "mixed": WINDOWS})
    keys = [("s", "one", 0), ("s", "both", 0), ("s", "mixed", 0)]
    assert [mx.same_windows(base, cand, k) for k in keys] == [True, True, False]
    pp = forced_pairs(base, cand, keys)
    assert sorted(pp.keys) == [("s", "both", 0), ("s", "one", 0)]
    assert float(pp.kl.max()) == 0.0  # the same scores: compared like for like


@pytest.mark.parametrize("together, base_len, cand_len", [(True, 160, 400), (False, 160, 400), (True, 400, 160),
                                                         (False, 400, 160)])
def test_a_compare_gives_both_servers_the_smaller_limit_so_long_pairs_are_compared(tmp_path, fake_server, together,
                                                                                  base_len, cand_len):
    """One server admits 160 tokens, the other 400. Each item asks for as many tokens as the smaller
    admits beside its prompt, so its echo (one token more) must be windowed there, and the other
    server alone would score it in one request: different windows, the pair left out. The compare
    gives both the smaller limit (159 prompt tokens), so both score the same windows and every pair
    is compared; also when the servers run one at a time, baseline first, as long as the candidate
    admits at least as much. A candidate that admits less than a baseline that scored first cannot
    be matched (that server is gone): its pairs stay left out, with a warning that says why."""
    import json
    import os
    import subprocess
    import sys

    from kvqual.judge.teacher import WINDOWS_DIFFER
    from kvqual.forced import load_forced
    from kvqual.forcing.teacher import chunk_windows
    from kvtest import write_suite

    base = fake_server("--token-ids", "--metrics", "--answer-tokens", "500", "--max-model-len", str(base_len))
    cand = fake_server("--token-ids", "--metrics", "--answer-tokens", "500", "--max-model-len", str(cand_len))
    prompts = [f"Write at length about river {i}:" for i in range(12)]
    write_suite(tmp_path / "s.jsonl", [{"id": f"r{i}", "prompt": p, "max_tokens": 160 - len(p)}
                                       for i, p in enumerate(prompts)])
    (tmp_path / "kvqual.toml").write_text(f'[targets.base]\nbase_url = "{base.base_url}"\n'
                                          f'[targets.cand]\nbase_url = "{cand.base_url}"\n'
                                          f'[run]\nserve_together = {str(together).lower()}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "kvqual", "compare", "base", "cand", "--suite", "s.jsonl",
                           "--fixed-n", "--max-tokens", "200"], cwd=tmp_path, env={**os.environ, "CI": "true"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 3), done.stdout + done.stderr
    report = json.loads(next((tmp_path / "results").glob("compare-*/report.json")).read_text())
    tf = report["teacher_forcing"]
    runs = report["runs"]
    folder = tmp_path / "results" / runs["baseline"]["run_id"]
    on_base = load_forced(folder / f"teacher-by-{runs['baseline']['run_id']}.jsonl", logprobs=False)
    on_cand = load_forced(folder / f"teacher-by-{runs['candidate']['run_id']}.jsonl", logprobs=False)
    assert set(on_base) == set(on_cand) and len(on_cand) == 12
    if not together and cand_len < base_len:
        assert tf["window_limit"] == {"baseline": 399, "candidate": 159}
        assert tf["usable"] == 0 and tf["left_out"] == {WINDOWS_DIFFER: 12}, json.dumps(tf)
        assert "cand admits 159 prompt tokens, base 399" in done.stderr
        return
    assert tf["window_limit"] == {"baseline": 159, "candidate": 159}
    assert tf["pairs"] == tf["usable"] == 12 and tf["chunked"] == 12 and not tf["left_out"], json.dumps(tf)
    for key, f in on_cand.items():
        prompt, completion = len(prompts[int(key[1][1:])]), 160 - len(prompts[int(key[1][1:])])
        assert f.chunks == on_base[key].chunks == {"max_prompt": 159,
                                                   "windows": [list(w) for w in chunk_windows(prompt, completion, 159)]}
        assert len(chunk_windows(prompt, completion, 399)) == 1  # the larger server's own limit: one request
    assert report["suites"]["overall"]["teacher"]["ab"]["mean_kl"] == 0  # the same scores, compared like for like
    assert "admits" not in done.stderr
