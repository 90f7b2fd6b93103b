"""Outputs files for `kvqual audit`: the accepted shapes, the line a bad one names, and the streaming,
seeded, stratified sample."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from kvqual.errors import SuiteError
from kvqual.suites.outputs import allocate, draw, join_batch_input, parse_output, read


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_documented_shape_reads() -> None:
    own = parse_output({"id": "a", "prompt": "Q: 2+2?", "completion": " 4", "category": "arith", "max_tokens": 8},
                       "f", 1)
    assert (own.item.prompt, own.text, own.item.category, own.item.max_tokens) == ("Q: 2+2?", " 4", "arith", 8)
    alias = parse_output({"prompt": "p", "response": "r"}, "f", 7)
    assert alias.text == "r" and alias.item.id == "L7"  # no id: the line number
    chat = parse_output({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
                        "f", 2)
    assert chat.text == "hello" and [m["role"] for m in chat.item.messages] == ["user"]
    vllm = parse_output({"prompt": "p", "outputs": [{"text": " t", "token_ids": [5, 6], "finish_reason": "length"}]},
                        "f", 3)
    assert (vllm.text, vllm.token_ids, vllm.finish_reason) == (" t", (5, 6), "length")
    ids = parse_output({"prompt_token_ids": [1, 2, 3], "outputs": [{"text": "x"}]}, "f", 4)
    assert ids.item.prompt == (1, 2, 3)
    batch = parse_output({"custom_id": "r1", "response": {"status_code": 200, "body": {
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}}}, "f", 5)
    assert (batch.custom_id, batch.text, batch.finish_reason) == ("r1", "ok", "stop")


@pytest.mark.parametrize("row, words", [
    ({"prompt": "p"}, "no completion"),
    ([1, 2], "expected a JSON object"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "a turn before the assistant's"),
    ({"custom_id": "r", "response": {"status_code": 500, "body": {}}, "error": None}, "failed"),
    ({"prompt": 3, "completion": "x"}, "prompt"),
    ('{"prompt": "p", "completion": ', "not valid JSON"),
])
def test_a_line_kvqual_cannot_read_names_the_file_and_line(tmp_path, row, words) -> None:
    f = _write(tmp_path / "out.jsonl", [{"prompt": "ok", "completion": "fine"}, "", row])
    with pytest.raises(SuiteError) as err:
        list(read(f))
    assert err.value.line == 3 and str(err.value).startswith(f"{f}:3: ") and words in str(err.value)


def test_missing_file_and_empty_file(tmp_path) -> None:
    with pytest.raises(SuiteError, match="file not found"):
        draw(tmp_path / "nope.jsonl", 5, 0)
    with pytest.raises(SuiteError, match="no outputs"):
        draw(_write(tmp_path / "empty.jsonl", [""]), 5, 0)


def test_allocation_is_proportional_and_exact() -> None:
    assert allocate({"a": 900, "b": 100}, 100) == {"a": 90, "b": 10}
    got = allocate({"a": 5, "b": 3, "c": 2}, 7)
    assert sum(got.values()) == 7 and all(got[s] <= n for s, n in {"a": 5, "b": 3, "c": 2}.items())
    assert allocate({"a": 2, "b": 1}, 10) == {"a": 2, "b": 1}


def test_the_sample_is_seeded_stratified_and_the_same_whatever_the_lines_around_it(tmp_path) -> None:
    rows = [{"id": f"x{i}", "prompt": f"p{i}", "completion": "c", "category": "big" if i % 10 else "small"}
            for i in range(2000)]
    f = _write(tmp_path / "out.jsonl", rows)
    one, again, other = draw(f, 100, 1), draw(f, 100, 1), draw(f, 100, 2)
    assert [o.item.id for o in one.outputs] == [o.item.id for o in again.outputs]
    assert [o.item.id for o in one.outputs] != [o.item.id for o in other.outputs]
    assert one.lines == 2000 and dict(one.strata) == {"category:big": 1800, "category:small": 200}
    assert dict(one.allocation) == {"category:big": 90, "category:small": 10}
    assert sum(o.item.category == "small" for o in one.outputs) == 10
    # without categories: length classes (the short and the long outputs both represented)
    rows = [{"prompt": f"p{i}", "completion": "c" * (5 if i % 4 else 500)} for i in range(400)]
    drawn = draw(_write(tmp_path / "len.jsonl", rows), 40, 0)
    assert dict(drawn.allocation) == {"chars<16": 30, "chars<512": 10}


def test_reading_streams_in_memory_that_grows_with_the_sample_not_the_file(tmp_path) -> None:
    def peak(lines: int) -> int:
        f = tmp_path / f"o{lines}.jsonl"
        with f.open("w") as fh:
            for i in range(lines):
                fh.write(json.dumps({"prompt": f"prompt {i} " + "x" * 200, "completion": "y" * 400}) + "\n")
        tracemalloc.start()
        draw(f, 50, 0)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(1_000), peak(10_000)
    assert large < 1.5 * small, (small, large)  # ten times the file, not ten times the memory


def test_duplicate_ids_in_the_sample_name_both_lines(tmp_path) -> None:
    f = _write(tmp_path / "d.jsonl", [{"id": "same", "prompt": "a", "completion": "x"},
                                      {"id": "same", "prompt": "b", "completion": "y"}])
    with pytest.raises(SuiteError, match=r"d.jsonl:2: duplicate id 'same' \(also on line 1\)"):
        draw(f, 10, 0)


def test_batch_outputs_take_their_prompts_from_the_batch_input(tmp_path) -> None:
    def out(i: int) -> dict:
        return {"id": f"batch_{i}", "custom_id": f"req-{i}", "response": {"status_code": 200, "body": {
            "object": "text_completion", "choices": [{"text": f" answer {i}", "finish_reason": "stop"}]}}}

    f = _write(tmp_path / "batch_out.jsonl", [out(i) for i in range(30)])
    inp = _write(tmp_path / "batch_in.jsonl", [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": f"question {i}", "max_tokens": 16}} for i in range(30)])
    drawn = join_batch_input(draw(f, 10, 0), inp)
    assert len(drawn.outputs) == 10 and all(o.custom_id is None for o in drawn.outputs)
    o = drawn.outputs[0]
    n = int(o.item.id.removeprefix("req-"))  # a batch output is known by its custom_id
    assert (o.item.prompt, o.item.max_tokens, o.text) == (f"question {n}", 16, f" answer {n}")
    short = _write(tmp_path / "short_in.jsonl", [{"custom_id": "req-0", "body": {"prompt": "q"}}])
    with pytest.raises(SuiteError, match="have no input line here"):
        join_batch_input(draw(f, 10, 0), short)
