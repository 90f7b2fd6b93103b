"""Built-in suites: deterministic from a seed, self-consistent, listed and written by the CLI."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter, defaultdict

import pytest

from kvqual.errors import UsageError
from kvqual.records import dumps_line
from kvqual.suites import generated, scorers
from kvqual.suites.generated import BUILTIN_SUITES, CHARS_PER_TOKEN, PROFILES, generate


def jsonl(name: str, seed: int, limit: int | None = None) -> str:
    return "".join(dumps_line(it.to_json()) for it in generate(name, seed=seed, limit=limit))


SEEDED = sorted(name for name, suite in BUILTIN_SUITES.items() if suite.seeded)  # longgen is a shipped file


@pytest.mark.parametrize("name", SEEDED)
def test_same_seed_same_bytes_other_seed_other_items(name: str) -> None:
    a, b = jsonl(name, 7, 6), jsonl(name, 7, 6)
    assert a == b
    assert jsonl(name, 8, 6) != a
    # item i does not depend on how many were asked for
    assert jsonl(name, 7, 3) == "".join(a.splitlines(keepends=True)[:3])


def test_pinned_items_of_default_seed() -> None:
    """Guards byte-identity across Python runs and platforms (blake2b and str-seeded random are stable)."""
    text = jsonl("arith", 0, 5)
    assert text.splitlines()[0] == (
        '{"id":"arith-0000","messages":[{"role":"user","content":"Compute 4 + 5. Write only the result '
        'as a number."}],"answer":"9","scorer":"number","max_tokens":48,"category":"add1"}')
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "614ad6777945d120"
    assert generate("passkey", seed=0, limit=1)[0].answer == "74264"
    assert hashlib.sha256(jsonl("passkey", 0, 3).encode()).hexdigest()[:16] == "61cd78f028ecbb6e"


def _prompt_key(item) -> str:
    """What the server sees: the rendered messages (or the prompt)."""
    return json.dumps(item.messages if item.messages is not None else item.prompt, sort_keys=True)


DISTINCT_N = 4096  # items a seeded suite must give with pairwise-distinct prompts


@pytest.mark.parametrize("seed", [0, 1234])
@pytest.mark.parametrize("name", SEEDED)
def test_the_first_4096_prompts_are_distinct_and_each_item_stands_alone(name: str, seed: int) -> None:
    suite = BUILTIN_SUITES[name]
    digests = set()
    for i in range(DISTINCT_N):  # one item at a time: a pure function of (seed, i)
        digests.add(hashlib.sha256(_prompt_key(suite.make(name, seed, i)).encode()).digest())
    assert len(digests) == DISTINCT_N
    # the first k items of the suite are items 0..k-1 made alone
    assert generate(name, seed=seed, limit=40) == [suite.make(name, seed, i) for i in range(40)]
    assert generate(name, seed=seed, limit=12) == generate(name, seed=seed, limit=40)[:12]


@pytest.mark.parametrize("name", SEEDED)
def test_every_category_space_holds_4096_items_and_a_suite_raises_past_its_space(name: str) -> None:
    suite = BUILTIN_SUITES[name]
    assert suite.distinct is not None and suite.distinct >= DISTINCT_N, (
        f"{name}: only its first {suite.distinct} items have distinct prompts; widen the smallest space")
    suite.make(name, 5, suite.distinct - 1)  # the last distinct item exists
    with pytest.raises(UsageError, match="distinct .* never repeated"):
        suite.make(name, 5, suite.distinct)  # the next would repeat a prompt: refused, for any seed
    with pytest.raises(UsageError, match=f"has {suite.distinct:,} items with distinct prompts, asked for"):
        generate(name, limit=suite.distinct + 1)


def test_a_category_filter_stops_at_the_suites_distinct_items() -> None:
    sub1 = generate("arith", categories=("sub1",), limit=1152)  # 36 facts x 32 phrasings, all of them
    assert len({_prompt_key(it) for it in sub1}) == 1152
    with pytest.raises(UsageError, match="has 1,152 items of sub1 among its 5,762 items with distinct prompts"):
        generate("arith", categories=("sub1",), limit=1153)


def test_a_category_space_too_small_raises_instead_of_repeating(monkeypatch: pytest.MonkeyPatch) -> None:
    # one way of asking instead of four: sub1's 36 facts x 8 questions = 288 prompts, so arith's
    # 1,442nd item (i = 5 * 288 + 2) would be a repeat
    monkeypatch.setattr(generated, "_ARITH_ASKS", ("Answer with the number only.",))
    make = BUILTIN_SUITES["arith"].make
    prompts = {_prompt_key(make("arith", 0, i)) for i in range(5 * 288 + 2)}
    assert len(prompts) == 5 * 288 + 2
    with pytest.raises(UsageError, match="has 288 distinct 'sub1' prompts, and item 1442 would repeat one"):
        make("arith", 0, 5 * 288 + 2)


@pytest.mark.parametrize("n", [1, 2, 7, 36, 100, 4097])
def test_permute_is_a_bijection(n: int) -> None:
    order = [generated._permute(j, n, "k", 1) for j in range(n)]
    assert sorted(order) == list(range(n))
    if n > 2:  # another key, another order
        assert order != [generated._permute(j, n, "k", 2) for j in range(n)]


def test_combo_is_a_bijection_whose_first_dimension_moves_fastest() -> None:
    sizes = (5, 3, 4)
    combos = [generated._combo(j, sizes, "k") for j in range(60)]
    assert sorted(combos) == sorted((a, b, c) for a in range(5) for b in range(3) for c in range(4))
    for run in range(12):  # each run of 5 takes every value of the first dimension once
        assert sorted(c[0] for c in combos[5 * run:5 * run + 5]) == list(range(5))


@pytest.mark.parametrize("name", SEEDED)
def test_items_are_well_formed_and_their_answers_score(name: str) -> None:
    items = generate(name, seed=3)
    assert len(items) == BUILTIN_SUITES[name].default_n
    assert len({it.id for it in items}) == len(items)
    for it in items:
        assert it.suite == name and it.messages and it.answer and it.max_tokens
        scorers.validate(it.scorer or "exact", it.scorer_params)
        if scorers.needs_answer(it.scorer or "exact", it.scorer_params):
            assert scorers.score(it, it.answer) == 1.0, it.id  # the reference answer is right
            assert scorers.score(it, "I do not know.") == 0.0, it.id


@pytest.mark.parametrize("name", ["passkey", "needles", "kv_recall"])
def test_retrieval_answer_is_in_the_prompt_once_per_question(name: str) -> None:
    for it in generate(name, seed=1):
        text = it.messages[0]["content"]
        assert re.search(rf"\b{it.answer}\b", text), it.id


def test_passkey_lengths_and_depths() -> None:
    items = generate("passkey", seed=0, limit=9)
    for it in items:
        content = it.messages[0]["content"]
        want = it.meta["length_tokens"] * CHARS_PER_TOKEN
        assert want <= len(content) <= want + 400  # filler to length + question framing
        position = content.index(f"The pass key is {it.answer}.") / len(content)
        assert abs(position - it.meta["depth"]) < 0.1
    assert {it.meta["length_tokens"] for it in items} == {512, 1024, 2048}
    assert {it.meta["depth"] for it in items} == {0.1, 0.5, 0.9}
    longest = generate("passkey_long", seed=0, limit=2)[1]
    assert longest.meta["length_tokens"] == 7168


def test_shared_documents_share_a_context_id() -> None:
    for name, per_doc in (("needles", 3), ("kv_recall", 2), ("shared_prefix", 4)):
        groups: dict[str, list] = defaultdict(list)
        for it in generate(name, seed=0, limit=per_doc * 50):
            groups[it.context_id].append(it)
        assert all(len(g) == per_doc for g in groups.values())
        for g in groups.values():
            prompts = {it.messages[0]["content"].rsplit("\n\n", 1)[0] for it in g}
            assert len(prompts) == 1  # one document, different questions
            assert len({it.answer for it in g}) >= 1 and len({it.messages[0]["content"] for it in g}) == per_doc
    assert all(it.context_id is None for it in generate("arith"))


def test_arith_answers_are_right_and_stay_1_to_2_digit_arithmetic() -> None:
    for it in generate("arith", seed=5, limit=2000):
        a, op, b = re.search(r"(\d+) ([-+*]) (\d+)[?. ]", it.messages[0]["content"]).groups()
        assert int(it.answer) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert max(len(a), len(b)) <= 2 and 0 < int(it.answer) <= 99 + 9, it.messages[0]["content"]


@pytest.mark.parametrize("name", ["arith", "instruct", "long_decode"])
def test_every_phrasing_keeps_an_answer_that_scores(name: str) -> None:
    for it in generate(name, seed=9, limit=1500):
        if scorers.needs_answer(it.scorer or "exact", it.scorer_params):
            assert scorers.score(it, it.answer) == 1.0, it.id


def _profile_items(profile: str) -> list:
    return [it for name, n, cats in PROFILES[profile] for it in generate(name, limit=n, categories=cats)]


def test_profiles_name_real_suites_and_quick_is_small() -> None:
    for mix in PROFILES.values():
        assert all(name in BUILTIN_SUITES and n > 0 for name, n, _ in mix)
    items = _profile_items("quick")
    assert len(items) == sum(n for _, n, _ in PROFILES["quick"]) == 124  # every entry finds its n items
    assert sum(it.max_tokens for it in items) <= 10_000  # the most one arm can generate
    # prompt tokens are what a CPU compare spends its time on (6 prefills of each prompt)
    prompt_tokens = sum(len(m["content"]) for it in items for m in it.messages) / CHARS_PER_TOKEN
    assert prompt_tokens <= 16_000
    assert "passkey_long" not in {name for name, _, _ in PROFILES["quick"]}
    assert max(it.meta["length_tokens"] for it in items if it.suite in ("passkey", "needles")) <= 1024


def test_default_is_a_pool_of_17_quick_mixes_with_distinct_prompts() -> None:
    quick, pool = PROFILES["quick"], PROFILES["default"]
    assert [(name, cats) for name, _, cats in pool] == [(name, cats) for name, _, cats in quick]
    assert [n for _, n, _ in pool] == [17 * n for _, n, _ in quick] == [136, 102, 408, 272, 680, 510]
    items = _profile_items("default")
    assert len(items) == 2108 == 124 * 17  # the gate's last look: at least 2,000 distinct prompts
    assert len({_prompt_key(it) for it in items}) == 2108
    by_suite = Counter(it.suite for it in items)
    assert {name: by_suite[name] / 2108 for name, _, _ in quick} == {name: n / 124 for name, n, _ in quick}
    # each entry's categories, in the proportions the suite cycles them
    assert {it.category for it in items if it.suite == "passkey"} == {"len512", "len1024"}
    assert Counter(it.category for it in items if it.suite == "arith") == dict.fromkeys(generated.ARITH_FACTS, 136)
    assert Counter(it.category for it in items if it.suite == "instruct") == dict.fromkeys(generated.INSTRUCT_KINDS, 102)
    assert max(it.meta["length_tokens"] for it in items if it.suite in ("passkey", "needles")) <= 1024
    # the quick mix is the head of each of the pool's entries: the same items
    pool_ids = {it.id for it in items}
    assert all(it.id in pool_ids for it in _profile_items("quick"))


def test_category_filter_keeps_the_full_suites_items() -> None:
    full = {it.id: it for it in generate("passkey", limit=60)}
    picked = generate("passkey", limit=10, categories=("len512", "len1024"))
    assert len(picked) == 10 and {it.category for it in picked} == {"len512", "len1024"}
    assert all(full[it.id] == it for it in picked)  # same ids, byte-identical content
    assert [it.id for it in picked][:4] == ["passkey-0000", "passkey-0001", "passkey-0003", "passkey-0004"]
    # without a limit: the matching items among the suite's own default_n
    assert len(generate("passkey", categories=("len2048",))) == BUILTIN_SUITES["passkey"].default_n // 3
    with pytest.raises(UsageError, match="no category 'len9'.*known: len1024, len2048, len512"):
        generate("passkey", categories=("len9",))


def test_unknown_suite_and_negative_limit() -> None:
    with pytest.raises(UsageError, match="unknown built-in suite"):
        generate("nope")
    with pytest.raises(UsageError, match="--limit"):
        generate("arith", limit=-1)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    generated.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_lists_suites(capsys: pytest.CaptureFixture[str]) -> None:
    assert generated.run(_args()) == 0
    out = capsys.readouterr().out
    for suite in BUILTIN_SUITES.values():
        assert re.search(rf"^{suite.name}\s+{suite.default_n}\s+\S", out, re.M)
    assert re.search(r"^profile default \(2108 items\): 136×passkey\[len512,len1024\], 102×needles\[len512\], "
                     r"408×kv_recall, 272×long_decode, 680×arith, 510×instruct$", out, re.M)
    assert re.search(r"^profile quick \(124 items\): 8×passkey\[len512,len1024\], 6×needles\[len512\], ", out, re.M)
    assert re.search(r"^arith\s+50\s+5,762\s+number ", out, re.M)  # how many items are distinct
    assert "profile thorough (502 items):" in out


def test_cli_writes_suite_and_refuses_overwrite(tmp_path) -> None:
    out = tmp_path / "arith.jsonl"
    assert generated.run(_args("--write", "arith", "--seed", "4", "--limit", "10", "-o", str(out))) == 0
    assert out.read_text() == jsonl("arith", 4, 10)
    with pytest.raises(UsageError, match="exists"):
        generated.run(_args("--write", "arith", "-o", str(out)))
    assert generated.run(_args("--write", "kv_recall", "-o", str(out), "--force")) == 0
    assert out.read_text() == jsonl("kv_recall", 0)


@pytest.mark.parametrize("name", sorted(BUILTIN_SUITES))
def test_written_suite_loads_through_the_jsonl_loader(name: str, tmp_path) -> None:
    from kvqual.suites.jsonl import load_jsonl_suite

    path = tmp_path / f"{name}.jsonl"
    path.write_text(jsonl(name, 2, 10))
    assert load_jsonl_suite(path) == generate(name, seed=2, limit=10)


def test_longgen_is_the_shipped_training_prompts_without_answers_and_with_a_long_max_tokens() -> None:
    from pathlib import Path

    from kvqual.suites.jsonl import load_jsonl_suite

    shipped = Path(generated.__file__).parent / "data" / generated.TRAINING_PROMPTS
    example = Path(__file__).parents[2] / "suites" / "training_prompts.jsonl"
    assert shipped.read_bytes() == example.read_bytes()  # the package's copy is the example file
    source = load_jsonl_suite(example)
    items = generate("longgen")
    assert [it.id for it in items] == [it.id for it in source] and len(items) == BUILTIN_SUITES["longgen"].default_n
    for it, src in zip(items, source):
        assert it.suite == "longgen" and it.answer is None and it.scorer is None
        assert (it.messages, it.prompt, it.category) == (src.messages, src.prompt, src.category)
        assert it.max_tokens == generated.LONGGEN_MAX_TOKENS
    assert generate("longgen", seed=5) == items  # a shipped file: no seed
    with pytest.raises(UsageError, match="has 64 prompts"):
        generate("longgen", limit=65)


def test_longgen_profile_keeps_the_categories_that_write_long() -> None:
    items = _profile_items("longgen")
    assert len(items) == 34 and len({it.id for it in items}) == 34
    assert {it.category for it in items} == {"chat", "tool_use", "writing", "qa", "reasoning", "completion"}
    assert all(it.answer is None and it.max_tokens == 512 for it in items)
    assert sum(it.max_tokens for it in items) <= 20_000  # the most one arm can generate


def test_longgen_profile_resolves_and_loads() -> None:
    from kvqual.suites import load_suites, resolve_specs

    assert resolve_specs(["profile:longgen"]) == [
        "builtin:longgen[chat,tool_use,writing,qa,reasoning,completion]@34"]
    (suite,) = load_suites(["profile:longgen"], seed=1234, limit=None)
    assert suite.ref.name == "longgen" and suite.ref.n_items == 34
