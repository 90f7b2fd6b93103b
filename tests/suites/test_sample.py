"""`kvqual sample`: exact n, proportional strata, reproducible, bounded memory, all input forms."""

from __future__ import annotations

import argparse
import gzip
import json
import random
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from kvqual.errors import SuiteError, UsageError
from kvqual.suites import sample
from kvqual.suites.sample import allocate, sample_prompts

CATEGORIES = {"code": 0.5, "chat": 0.3, "math": 0.15, "rare": 0.05}


def write_big(path: Path, n_lines: int) -> Counter[str]:
    """A synthetic training dump: categories drawn with fixed weights, a few forms of prompt."""
    rng = random.Random(1)
    counts: Counter[str] = Counter()
    cats, weights = zip(*CATEGORIES.items())
    with open(path, "w") as f:
        for i in range(n_lines):
            cat = rng.choices(cats, weights)[0]
            counts[cat] += 1
            f.write(json.dumps({"id": f"r{i}", "category": cat, "prompt": f"prompt {i} " + "x" * 60}) + "\n")
    return counts


def test_acceptance_100k_lines(tmp_path: Path) -> None:
    path = tmp_path / "dump.jsonl"
    counts = write_big(path, 100_000)
    n = 1000
    tracemalloc.start()
    items = sample_prompts(path, n=n, by="category", seed=3)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(items) == n
    got = Counter(it.category for it in items)
    for cat, count in counts.items():
        assert abs(got[cat] - n * count / 100_000) <= 1, (cat, got[cat])
    assert sample_prompts(path, n=n, by="category", seed=3) == items
    assert len({it.id for it in items}) == n and all(it.answer is None for it in items)
    assert peak < path.stat().st_size / 10, (peak, path.stat().st_size)


def test_allocate_exact_and_within_one() -> None:
    counts = {"a": 7, "b": 3, "c": 1}
    for n in range(1, 12):
        quota = allocate(counts, n)
        assert sum(quota.values()) == n
        assert all(abs(quota[k] - n * c / 11) < 1 for k, c in counts.items())
    assert allocate({"a": 1, "b": 1}, 1) == {"a": 1, "b": 0}  # ties broken by name
    with pytest.raises(UsageError, match="only 2 usable"):
        allocate({"a": 1, "b": 1}, 3)


def test_forms_are_normalised_and_last_assistant_turn_dropped(tmp_path: Path) -> None:
    rows = [
        {"prompt": "Once upon a time", "category": "story"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello!"}], "category": "chat"},
        {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
                           {"from": "human", "value": "and 3+3?"}, {"from": "gpt", "value": "6"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                                   {"type": "image_url", "image_url": {"url": "x"}}]}]},
    ]
    path = tmp_path / "mixed.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = sample_prompts(path, n=4, by=None, seed=0)
    assert [it.id for it in items] == ["L1", "L2", "L3", "L4"] and items[0].suite == "mixed"
    assert items[0].prompt == "Once upon a time" and items[0].messages is None
    assert items[1].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert items[2].messages == ({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                                 {"role": "user", "content": "and 3+3?"})
    assert items[3].messages == ({"role": "user", "content": "Describe"},)


def test_parquet_input(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [f"p{i}" for i in range(200)], "lang": ["en" if i % 4 else "de" for i in range(200)],
                      "messages": [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
                                   for i in range(200)]})
    path = tmp_path / "chats.parquet"
    pq.write_table(table, path, row_group_size=64)
    items = sample_prompts(path, n=20, by="lang", seed=1)
    assert Counter(it.category for it in items) == {"en": 15, "de": 5}
    assert sample_prompts(path, n=20, by="lang", seed=1) == items
    assert sample_prompts(path, n=20, by="lang", seed=2) != items
    assert all(len(it.messages) == 1 and it.messages[0]["role"] == "user" for it in items)


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": "ok"\n{"text": "no prompt"}\n')
    with pytest.raises(SuiteError, match=r"bad.jsonl:2: invalid JSON"):
        sample_prompts(path, n=1, by=None, seed=0)
    bad: list[tuple[int, str]] = []
    items = sample_prompts(path, n=1, by=None, seed=0, on_bad=lambda line, why: bad.append((line, why)))
    assert [it.id for it in items] == ["L1"]
    assert [line for line, _ in bad] == [2, 3] and "no prompt" in bad[1][1]
    path.write_text('{"messages": [{"role": "wizard", "content": "hi"}]}\n')
    with pytest.raises(SuiteError, match=r":1: unknown role 'wizard'"):
        sample_prompts(path, n=1, by=None, seed=0)


def test_duplicate_dataset_ids_made_unique(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"id": "same", "prompt": f"p{i}"}) + "\n" for i in range(3)))
    assert [it.id for it in sample_prompts(path, n=3, by=None, seed=0)] == ["same-L1", "same-L2", "same-L3"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sample.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_writes_loadable_suite_and_refuses_overwrite(tmp_path: Path, capsys) -> None:
    from kvqual.suites.jsonl import load_jsonl_suite

    src = Path(__file__).parents[2] / "suites" / "training_prompts.jsonl"
    out = tmp_path / "train.jsonl"
    assert sample.run(_args(str(src), "--n", "20", "--by", "category", "-o", str(out))) == 0
    assert "wrote 20 prompts" in capsys.readouterr().out
    loaded = load_jsonl_suite(out)
    assert len(loaded) == 20 and all(not it.scored for it in loaded)
    with pytest.raises(UsageError, match="exists"):
        sample.run(_args(str(src), "--n", "5", "-o", str(out)))
    assert sample.run(_args(str(src), "--n", "5", "-o", str(out), "--force")) == 0
    assert len(out.read_text().splitlines()) == 5
    with pytest.raises(UsageError, match="no such file"):
        sample.run(_args(str(tmp_path / "missing.jsonl"), "--n", "5", "-o", str(tmp_path / "x.jsonl")))


def test_shipped_training_prompts_are_valid() -> None:
    from kvqual.suites.jsonl import load_jsonl_suite

    items = load_jsonl_suite(Path(__file__).parents[2] / "suites" / "training_prompts.jsonl")
    cats = Counter(it.category for it in items)
    assert len(items) >= 60 and len(cats) >= 8 and all(it.answer is None for it in items)


def test_by_a_field_no_record_has_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    from kvqual.cli import main

    src = tmp_path / "dump.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "category": "chat", "prompt": f"p {i}"}) + "\n"
                           for i in range(10)))
    out = tmp_path / "out.jsonl"
    assert main(["sample", str(src), "--n", "4", "--by", "catgory", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert captured.err == (f"kvqual: error: --by catgory: no record in {src} has a field 'catgory' "
                            "(fields: category, id, prompt)\n")
    assert not out.exists()  # nothing written under "(none)"
    # a field that only some records carry still stratifies: the rest form the "(none)" stratum
    src.write_text(src.read_text() + json.dumps({"id": "t", "prompt": "q", "topic": "x"}) + "\n")
    items = sample_prompts(src, n=11, by="topic", seed=0)
    assert Counter(it.category for it in items) == {"(none)": 10, "x": 1}


def test_max_tokens_sets_every_prompts_output_budget(tmp_path: Path, capsys) -> None:
    # the long-generation workload on the user's own prompts: `kvqual sample ... --max-tokens 4000`
    from kvqual.suites.jsonl import load_jsonl_suite

    src = Path(__file__).parents[2] / "suites" / "training_prompts.jsonl"
    out = tmp_path / "long.jsonl"
    assert sample.run(_args(str(src), "--n", "11", "--by", "category", "--max-tokens", "4000", "-o", str(out))) == 0
    assert {it.max_tokens for it in load_jsonl_suite(out)} == {4000}
    with pytest.raises(UsageError, match="--max-tokens must be at least 1"):
        sample.run(_args(str(src), "--n", "5", "--max-tokens", "0", "-o", str(tmp_path / "x.jsonl")))
    assert not (tmp_path / "x.jsonl").exists()
