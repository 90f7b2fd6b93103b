"""Built-in suites generated from a seed: probes that an fp8 KV cache breaks first.

Each suite is a pure function of (seed, item index): item i never depends on how many
items were asked for, so `generate(name, limit=k)` is the first k items of the full suite
and one seed always gives byte-identical items. Prompts never repeat within a suite, by
construction: each category enumerates a space of combinations and its j-th item takes the j-th
element of a seeded bijection of that space (`_draw`); asking past a space raises instead of
repeating (`BuiltinSuite.distinct`). `longgen` is the exception that takes no
seed: the shipped training-prompt example (`data/training_prompts.jsonl`) with a long
max_tokens, the `longgen` profile's prompts (docs/longgen.md). No model or tokenizer is needed: lengths
in tokens are approximated as characters / CHARS_PER_TOKEN (measured on the filler with
the SmolLM2 tokenizer: 3.99-4.04 characters per token).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Callable, Sequence

from kvqual.errors import UsageError
from kvqual.records import Item, dumps_line

__all__ = ["BUILTIN_SUITES", "BuiltinSuite", "PROFILES", "CHARS_PER_TOKEN", "entry_spec", "generate",
           "add_arguments", "run"]

CHARS_PER_TOKEN = 4.0

_FILLER = (
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
    "There and back again.", "The river flows to the sea.", "Birds sing in the morning.",
    "A cat sleeps on the mat.", "The road winds through the hills.", "Rain falls on the roof.",
    "The market opens at dawn.", "Clouds drift over the town.", "A dog barks far away.",
    "The old clock ticks on the wall.", "Leaves turn brown in autumn.",
)
_WORDS = (
    "apple river stone cloud green table window garden music paper silver orange tiger "
    "forest candle bridge yellow rocket planet winter summer pencil basket mirror dragon "
    "castle button jacket ladder meadow pepper rabbit saddle temple violet wallet anchor"
).split()
_COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "brown")
# everyday subjects a 135M model can write a sentence or a list about (the first 12 were the only ones)
_TOPICS = tuple(t.strip() for t in (
    "the ocean, a city at night, coffee, mountains, a library, trains, the moon, a garden, winter, "
    "bicycles, music, friendship, the desert, a forest, rain, snow, the beach, a river, a lake, an island, "
    "volcanoes, the stars, the sun, clouds, thunderstorms, autumn, spring, summer, a farm, a village, "
    "a market, a bakery, a museum, a school, a hospital, an airport, a bridge, a castle, a lighthouse, "
    "a zoo, a park, tea, bread, chocolate, apples, cheese, soup, rice, pizza, ice cream, honey, cats, "
    "dogs, horses, birds, bees, whales, elephants, owls, butterflies, penguins, books, maps, clocks, "
    "candles, mirrors, umbrellas, kites, boats, airplanes, cars, football, chess, swimming, running, "
    "painting, dancing, cooking, gardening, camping, fishing, the piano, the guitar, drums, movies, "
    "photography, poetry, the theater, a circus, a festival, computers, the internet, robots, telephones, "
    "science, history, mathematics, languages, geography, a birthday party, a wedding, a picnic, "
    "a road trip, a holiday, breakfast, a rainy day, a sunny morning, the weekend, sleep, a good teacher, "
    "a new neighbor, grandparents, kindness, patience, courage, teamwork, trees, flowers, the wind, "
    "a waterfall, a cave, a ship, a train station").split(","))
_NAMES = ("Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi",
          "Lena", "Marco", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tara", "Ugo", "Vera",
          "Wei", "Yuki")


def _rng(name: str, seed: int, *key: object) -> random.Random:
    """A generator seeded by text, so the stream is stable across Python runs and platforms."""
    return random.Random(":".join(str(k) for k in (name, seed, *key)))


# --- distinct prompts by construction ---------------------------------------------------


def _hash(*key: object) -> int:
    """A 64-bit number from text (blake2b): the same on every Python run and platform."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest(), "big")


def _permute(j: int, n: int, *key: object) -> int:
    """Element j of a seeded permutation of range(n), without building it: a 4-round Feistel
    network over the smallest even number of bits that holds n, applied again until the result
    lies below n (cycle walking). A bijection, so distinct j give distinct elements."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = j
    while True:
        left, right = x >> half, x & mask
        for r in range(4):
            left, right = right, left ^ (_hash(*key, r, right) & mask)
        x = (left << half) | right
        if x < n:
            return x


def _combo(j: int, sizes: Sequence[int], *key: object) -> tuple[int, ...]:
    """Combination j of the space sizes[0] × sizes[1] × …, a seeded bijection of range(prod(sizes)).
    The first dimension moves fastest: every run of sizes[0] consecutive j takes each of its values
    once (in a seeded order that changes from run to run); each further value is shifted by a hash
    of the values before it, so it changes from item to item too."""
    digits = []
    rest = j
    for n in sizes:
        rest, digit = divmod(rest, n)
        digits.append(digit)
    values = [_permute(digits[0], sizes[0], *key, digits[1:])]
    for digit, n in zip(digits[1:], sizes[1:]):
        values.append((digit + _hash(*key, *values)) % n)
    return tuple(values)


def _draw(suite: str, seed: int, i: int, what: str, j: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """Element j of the space `what` (sizes[0] × sizes[1] × …) of item i: distinct j give distinct
    elements; a j past the space raises rather than repeat one."""
    total = math.prod(sizes)
    if j >= total:
        raise UsageError(f"built-in suite {suite!r} has {total:,} distinct {what}, and item {i} would "
                         "repeat one: generated prompts are never repeated, so ask for fewer items")
    return _combo(j, sizes, suite, seed, what)


def _round_robin(spaces: Sequence[int]) -> int:
    """How many items are distinct when item i is of category i % len(spaces) and each category's
    space holds spaces[c] items: the index at which the first one runs out."""
    return min(len(spaces) * size + c for c, size in enumerate(spaces))


def _chat(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


_DISTRACTORS = ("The pass code is {n}.", "The key number is {n}.", "The passport number is {n}.",
                "The post code is {n}.", "Bus {n} leaves at noon.", "Room {n} is on the left.")


def _filler(rng: random.Random, n_chars: int, distractor_rate: float = 0.0) -> list[str]:
    """Bland sentences totalling about n_chars characters; some carry 5-digit distractors."""
    out: list[str] = []
    total = 0
    while total < n_chars:
        if rng.random() < distractor_rate:
            sentence = rng.choice(_DISTRACTORS).format(n=rng.randint(10000, 99999))
        else:
            sentence = rng.choice(_FILLER)
        out.append(sentence)
        total += len(sentence) + 1
    return out


def _insert(sentences: list[str], needles: list[tuple[float, str]]) -> str:
    """Put each needle sentence at its relative depth (0 = start, 1 = end) of the filler."""
    out = list(sentences)
    for depth, needle in sorted(needles, reverse=True):
        out.insert(round(depth * len(out)), needle)
    return " ".join(out)


# --- long-context retrieval -------------------------------------------------------------

_PASSKEY_DEPTHS = (0.1, 0.5, 0.9)
PASSKEYS = 90_000  # the 5-digit pass keys: each item has its own, so no two prompts are the same
NEEDLE_CODES = 9_000  # the 4-digit secret numbers: each needle of a suite has its own
_TABLE_HEAD = (900, 900)  # the first two 3-digit values of a kv_recall table: each table has its own


def _passkey_item(suite: str, lengths: tuple[int, ...], distractors: float, seed: int, i: int) -> Item:
    rng = _rng(suite, seed, i)
    length = lengths[i % len(lengths)]
    depth = _PASSKEY_DEPTHS[(i // len(lengths)) % len(_PASSKEY_DEPTHS)]
    key = str(10000 + _draw(suite, seed, i, "pass keys", i, (PASSKEYS,))[0])
    needle = f"The pass key is {key}. Remember it."
    doc = _insert(_filler(rng, int(length * CHARS_PER_TOKEN), distractors), [(depth, needle)])
    prompt = (
        "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n\n"
        f"{doc}\n\nWhat is the pass key? Answer with the number only."
    )
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=key,
                scorer="passkey", max_tokens=24, category=f"len{length}",
                meta={"length_tokens": length, "depth": depth})


def _needles_item(suite: str, lengths: tuple[int, ...], seed: int, i: int, per_doc: int = 3) -> Item:
    doc_index, q = divmod(i, per_doc)
    rng = _rng(suite, seed, doc_index)
    length = lengths[doc_index % len(lengths)]
    colors = rng.sample(_COLORS, per_doc)  # one question per color: distinct within the document
    codes = [str(1000 + _draw(suite, seed, i, "secret numbers", doc_index * per_doc + k, (NEEDLE_CODES,))[0])
             for k in range(per_doc)]  # no code in two documents: distinct documents
    depths = [(k + 0.5) / per_doc for k in range(per_doc)]
    needles = [(d, f"The secret number of the {c} box is {n}.") for d, c, n in zip(depths, colors, codes)]
    doc = _insert(_filler(rng, int(length * CHARS_PER_TOKEN)), needles)
    prompt = (
        f"Several boxes have secret numbers hidden in the text below.\n\n{doc}\n\n"
        f"What is the secret number of the {colors[q]} box? Answer with the number only."
    )
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=codes[q],
                scorer="passkey", max_tokens=24, category=f"len{length}",
                context_id=f"{suite}-doc{doc_index:04d}",
                meta={"length_tokens": length, "depth": depths[q], "needles": per_doc})


SHARED_PER_DOC = 4  # questions per shared document in `shared_prefix`: the first is cold, the rest warm


def _shared_prefix_item(suite: str, seed: int, i: int) -> Item:
    """A question about a document three others share word for word: the cache-path probe
    (docs/cache.md). The document comes first and the question last, so the rendered prompts share
    every token up to the question; the first question of a document is wave 0 (sent, and answered,
    before the others: cold on a prefix-caching server), the others wave 1 (warm)."""
    item = _needles_item(suite, (768, 1536), seed, i, per_doc=SHARED_PER_DOC)
    wave = 0 if i % SHARED_PER_DOC == 0 else 1
    return dataclasses.replace(item, meta={**item.meta, "cache_wave": wave})


def _kv_item(suite: str, seed: int, i: int, per_table: int = 2) -> Item:
    table_index, q = divmod(i, per_table)
    rng = _rng(suite, seed, table_index)
    sizes = (2, 4, 8)
    size = sizes[table_index % len(sizes)]
    keys = rng.sample(_WORDS, size)
    head = _draw(suite, seed, i, "tables", table_index, _TABLE_HEAD)  # no two tables open alike
    values = [str(100 + v) for v in head] + [str(rng.randint(100, 999)) for _ in keys[2:]]
    asked = rng.sample(range(size), per_table)[q]  # distinct keys: distinct questions on one table
    table = "\n".join(f"{k}: {v}" for k, v in zip(keys, values))
    prompt = (
        f"Here is a table of keys and values.\n\n{table}\n\n"
        f"What is the value for the key \"{keys[asked]}\"? Answer with the number only."
    )
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=values[asked],
                scorer="passkey", max_tokens=24, category=f"pairs{size}",
                context_id=f"{suite}-table{table_index:04d}", meta={"pairs": size})


# --- long decode ------------------------------------------------------------------------

DECODE_KINDS = ("copy6", "count15", "copy10", "count30")
_COUNT_FROM, _COUNT_TO = 10, 999  # counts stay within 2- and 3-digit numbers
_COUNT_TEMPLATES = (
    "Count from {a} to {b}, writing the numbers separated by commas and nothing else.",
    "Write the numbers from {a} to {b} in order, separated by commas, and nothing else.",
    "List every whole number from {a} to {b}, separated by commas. Write nothing else.",
)


def _decode_space(kind: str) -> tuple[int, ...]:
    """copy: one of the words per position; count: (start, phrasing)."""
    n = int(kind.removeprefix("copy").removeprefix("count"))
    if kind.startswith("copy"):
        return (len(_WORDS),) * n
    return (_COUNT_TO - n + 1 - _COUNT_FROM + 1, len(_COUNT_TEMPLATES))


def _decode_item(suite: str, seed: int, i: int) -> Item:
    kind = DECODE_KINDS[i % len(DECODE_KINDS)]
    drawn = _draw(suite, seed, i, f"{kind!r} prompts", i // len(DECODE_KINDS), _decode_space(kind))
    if kind.startswith("copy"):
        n = len(drawn)
        answer = ", ".join(_WORDS[v] for v in drawn)
        prompt = f"Repeat the following words exactly, in the same order, and nothing else:\n{answer}"
        max_tokens = 3 * n + 24
    else:
        n = int(kind[5:])
        start, template = _COUNT_FROM + drawn[0], _COUNT_TEMPLATES[drawn[1]]
        answer = ", ".join(str(k) for k in range(start, start + n))
        prompt = template.format(a=start, b=start + n - 1)
        max_tokens = 6 * n + 24  # the SmolLM2 tokenizer splits numbers into digits
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=answer,
                scorer="exact", scorer_params={"prefix": True, "ignore_case": True, "ignore_punct": True},
                max_tokens=max_tokens, category=kind, meta={"length_words": n})


# --- arithmetic -------------------------------------------------------------------------

# (a, op, b) facts per level: operands of 1-2 digits, positive whole answers (at most 99 + 9)
ARITH_FACTS: dict[str, tuple[tuple[int, str, int], ...]] = {
    "add1": tuple((a, "+", b) for a in range(1, 10) for b in range(1, 10)),
    "add2": tuple((a, "+", b) for a in range(10, 100) for b in range(1, 10)),
    "sub1": tuple((a, "-", b) for a in range(2, 10) for b in range(1, a)),  # results 1-8
    "mul1": tuple((a, "*", b) for a in range(2, 10) for b in range(2, 10)),
    "add10": tuple((a, "+", b) for a in range(10, 90, 10) for b in range(10, 100 - a, 10)),  # sums <= 90
}
# the small levels (36-81 facts) need phrasings to reach thousands of distinct prompts; every fact
# is asked once before any is asked again (the facts are the first dimension of `_combo`)
_ARITH_QUESTIONS = ("What is {e}?", "Compute {e}.", "Calculate {e}.", "What does {e} equal?", "Work out {e}.",
                    "Find the value of {e}.", "Evaluate {e}.", "How much is {e}?")
_ARITH_ASKS = ("Answer with the number only.", "Reply with just the number.", "Give only the number.",
               "Write only the result as a number.")


def _arith_space(level: str) -> tuple[int, ...]:
    return (len(ARITH_FACTS[level]), len(_ARITH_QUESTIONS), len(_ARITH_ASKS))


def _arith_item(suite: str, seed: int, i: int) -> Item:
    levels = tuple(ARITH_FACTS)
    level = levels[i % len(levels)]
    fact, question, ask = _draw(suite, seed, i, f"{level!r} prompts", i // len(levels), _arith_space(level))
    a, op, b = ARITH_FACTS[level][fact]
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    prompt = f"{_ARITH_QUESTIONS[question].format(e=f'{a} {op} {b}')} {_ARITH_ASKS[ask]}"
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=str(value),
                scorer="number", max_tokens=48, category=level)


# --- instruction following --------------------------------------------------------------

INSTRUCT_KINDS = ("word", "list", "short", "json", "start")
_LIST_TEMPLATES = (
    "List three facts about {topic} as a numbered list.",
    "Give three facts about {topic} as a numbered list.",
    "Write a numbered list of three things people like about {topic}.",
    "List three words that describe {topic}, as a numbered list.",
    "Write a numbered list of three questions about {topic}.",
    "List three reasons to learn about {topic} as a numbered list.",
    "Name three things related to {topic} in a numbered list.",
    "Write three short sentences about {topic} as a numbered list.",
)
_SHORT_LIMITS = (5, 8, 10)
_SHORT_TEMPLATES = ("Describe {topic} in at most {k} words.", "In at most {k} words, describe {topic}.",
                    "Say something about {topic} in {k} words or fewer.")
_AGES = range(18, 81)
_START_WORDS = ("Yes", "No", "Certainly", "Today", "Sure", "Well", "Indeed", "Honestly")


def _instruct_space(kind: str) -> tuple[int, ...]:
    """The topic first (where there is one), then the kind's own choices."""
    return {"word": (len(_TOPICS), len(_WORDS)), "list": (len(_TOPICS), len(_LIST_TEMPLATES)),
            "short": (len(_TOPICS), len(_SHORT_LIMITS), len(_SHORT_TEMPLATES)),
            "json": (len(_NAMES) * len(_AGES),), "start": (len(_TOPICS), len(_START_WORDS))}[kind]


def _instruct_item(suite: str, seed: int, i: int) -> Item:
    kind = INSTRUCT_KINDS[i % len(INSTRUCT_KINDS)]
    drawn = _draw(suite, seed, i, f"{kind!r} prompts", i // len(INSTRUCT_KINDS), _instruct_space(kind))
    topic = _TOPICS[drawn[0]] if kind != "json" else ""
    params: dict[str, object] = {}
    if kind == "word":
        word = _WORDS[drawn[1]]
        prompt = f"Write one sentence about {topic} that uses the word \"{word}\"."
        answer, scorer = word, "contains"
    elif kind == "list":
        prompt = _LIST_TEMPLATES[drawn[1]].format(topic=topic)
        answer, scorer = "a numbered list of at least 3 lines", "regex"
        params = {"pattern": r"^\s*1[.)] *\S.*\n\s*2[.)] *\S.*\n\s*3[.)] *\S", "flags": "m"}
    elif kind == "short":
        k = _SHORT_LIMITS[drawn[1]]
        prompt = _SHORT_TEMPLATES[drawn[2]].format(topic=topic, k=k)
        answer, scorer, params = f"at most {k} words", "word_count", {"max": k}
    elif kind == "json":
        name, age = _NAMES[drawn[0] % len(_NAMES)], _AGES[drawn[0] // len(_NAMES)]
        prompt = (f"Give a JSON object with the keys \"name\" and \"age\" for a person named "
                  f"{name} who is {age} years old. Output only the JSON.")
        answer, scorer, params = "JSON with keys name, age", "json_keys", {"keys": ["name", "age"]}
    else:
        word = _START_WORDS[drawn[1]]
        prompt = f"Start your reply with the word \"{word}\". Tell me about {topic} in one sentence."
        answer, scorer = word, "regex"
        params = {"pattern": rf"^\W*{word}\b", "flags": "i"}
    return Item(id=f"{suite}-{i:04d}", suite=suite, messages=_chat(prompt), answer=answer,
                scorer=scorer, scorer_params=params, max_tokens=64, category=kind)


# --- long generation on training prompts ------------------------------------------------

# max_tokens of a `longgen` item, sized for the embedded default (docs/longgen.md): kvqual serve
# admits a request when prompt + max_tokens fit its free KV tokens, so at 512 the built-in bf16
# target (11,650 tokens) decodes ~20 at once (at 1,024: 10, half the throughput); the long prompts'
# outputs reach the 256-1,023 KL bucket and a runaway stops at 2x the default cap. On a GPU server,
# sample your own prompts with `kvqual sample --max-tokens 4000` instead.
LONGGEN_MAX_TOKENS = 512
TRAINING_PROMPTS = "training_prompts.jsonl"  # kvqual/suites/data/: the shipped training-prompt example


@functools.lru_cache(maxsize=1)
def _training_prompts() -> tuple[dict, ...]:
    """The shipped training-prompt example (the package's copy of suites/training_prompts.jsonl)."""
    text = resources.files("kvqual.suites").joinpath("data", TRAINING_PROMPTS).read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def _longgen_item(suite: str, seed: int, i: int) -> Item:
    """Prompt i of the training-prompt example, without an answer (compared by distribution: lengths,
    truncation, loops, distinct-2, teacher-forced KL by position), with a long max_tokens."""
    prompts = _training_prompts()
    if i >= len(prompts):
        raise UsageError(f"built-in suite {suite!r} has {len(prompts)} prompts (asked for item {i})")
    from kvqual.suites.jsonl import parse_item

    item = parse_item(prompts[i], suite=suite, path=f"kvqual/suites/data/{TRAINING_PROMPTS}", line=i + 1)
    return dataclasses.replace(item, max_tokens=LONGGEN_MAX_TOKENS,
                               meta={**(item.meta or {}), "source_line": i + 1})


@dataclass(frozen=True)
class BuiltinSuite:
    """A generated suite: its name, what it probes, its scorer(s), its default size, and how many
    of its first items have pairwise-distinct prompts for any seed (`distinct`: item `distinct`
    and later raise instead of repeating a prompt; None for the shipped file)."""

    name: str
    description: str
    scorer: str
    default_n: int
    make: Callable[[str, int, int], Item]
    distinct: int | None = None
    seeded: bool = True  # False: fixed items (a shipped file), the same for every seed


BUILTIN_SUITES: dict[str, BuiltinSuite] = {
    s.name: s
    for s in (
        BuiltinSuite("passkey", "long-context retrieval: a 5-digit pass key at depth 10/50/90% "
                     "of 512/1K/2K-token filler full of look-alike 5-digit codes", "passkey", 36,
                     lambda n, s, i: _passkey_item(n, (512, 1024, 2048), 0.25, s, i), PASSKEYS),
        BuiltinSuite("passkey_long", "long-context retrieval: pass key at depth 10/50/90% of "
                     "4K/7K-token plain filler (near the default model's 8K context)", "passkey", 12,
                     lambda n, s, i: _passkey_item(n, (4096, 7168), 0.0, s, i), PASSKEYS),
        BuiltinSuite("needles", "multi-needle retrieval: 3 secret numbers per 512/1K-token "
                     "document, one question each (clustered by document)", "passkey", 24,
                     lambda n, s, i: _needles_item(n, (512, 1024), s, i), NEEDLE_CODES),
        BuiltinSuite("shared_prefix", "cache-path probe: 4 questions on each 768/1.5K-token document "
                     "(the same tokens up to the question); the first of each is sent first (cold), the "
                     "other 3 after it (warm on a prefix-caching server)", "passkey", 48, _shared_prefix_item,
                     NEEDLE_CODES),
        BuiltinSuite("kv_recall", "key-value recall: a table of 2/4/8 word→number pairs, "
                     "2 questions per table", "passkey", 36, _kv_item, 2 * math.prod(_TABLE_HEAD)),
        BuiltinSuite("long_decode", "long decode: copy 6/10 random words, count 15/30 numbers; the "
                     "output must start with them (decode path, length, stopping)", "exact", 24, _decode_item,
                     _round_robin([math.prod(_decode_space(k)) for k in DECODE_KINDS])),
        BuiltinSuite("arith", "arithmetic with exact answers: 1-digit +, -, ×; 2-digit + 1-digit; "
                     "tens + tens (5 levels)", "number", 50, _arith_item,
                     _round_robin([math.prod(_arith_space(level)) for level in ARITH_FACTS])),
        BuiltinSuite("instruct", "instruction following: use a word, a numbered list, a word limit, "
                     "JSON keys, a given first word", "contains/regex/word_count/json_keys", 40, _instruct_item,
                     _round_robin([math.prod(_instruct_space(kind)) for kind in INSTRUCT_KINDS])),
        BuiltinSuite("longgen", "long generation: the 64 shipped training prompts (code, chat, writing, ...) "
                     f"without answers, max_tokens {LONGGEN_MAX_TOKENS}; judged on lengths, truncation, loops "
                     "and KL by position", "(none)", 64, _longgen_item, seeded=False),
    )
}

# (suite, n, categories) entries: the first n items of the suite whose `category` is one of
# `categories` (empty: any). Items keep the ids and content they have in the full suite, so an
# item of `default` is the same item in `thorough`.
ProfileEntry = tuple[str, int, tuple[str, ...]]

QUICK_MIX: tuple[ProfileEntry, ...] = (
    ("passkey", 8, ("len512", "len1024")), ("needles", 6, ("len512",)), ("kv_recall", 24, ()),
    ("long_decode", 16, ()), ("arith", 40, ()), ("instruct", 30, ()))
POOL_SCALE = 17  # the default pool is 17 quick mixes, 2,108 items: the gate's looks at 124, 252, 511, 1,038, 2,108

PROFILES: dict[str, tuple[ProfileEntry, ...]] = {
    # the pool a compare draws its seeded order from: the quick mix's suites, categories and
    # proportions at 17x (2,108 items, every prompt distinct); the long-context suites keep their
    # 512/1K-token items, 2K-token pass keys (bf16 gets 0/6) stay in thorough
    "default": tuple((name, POOL_SCALE * n, cats) for name, n, cats in QUICK_MIX),
    # the small mix (124 items) for smoke runs and tests: a few minutes for `compare` on the
    # embedded default (2 CPU cores), where prompt tokens are the cost (prefilled by three runs
    # and three teacher-forcing passes)
    "quick": QUICK_MIX,
    # the cache-path probe (docs/cache.md): 12 shared documents, 4 questions each
    "cache": (("shared_prefix", 48, ()),),
    # long generation (docs/longgen.md): the shipped training prompts of the categories on which the
    # embedded default writes long (27 of these 34 ran past 170 tokens, against 7 of the other 30)
    "longgen": (("longgen", 34, ("chat", "tool_use", "writing", "qa", "reasoning", "completion")),),
    "thorough": (("passkey", 72, ()), ("passkey_long", 12, ()), ("needles", 48, ()), ("kv_recall", 72, ()),
                 ("long_decode", 48, ()), ("arith", 150, ()), ("instruct", 100, ())),
}

MAX_SCAN = 100_000  # items looked at to find `limit` items of the wanted categories


def entry_spec(entry: ProfileEntry) -> str:
    """A profile entry as a suite spec: `builtin:NAME[CAT,CAT]@N`."""
    name, n, categories = entry
    return f"builtin:{name}{'[' + ','.join(categories) + ']' if categories else ''}@{n}"


def generate(name: str, *, seed: int = 0, limit: int | None = None,
             categories: tuple[str, ...] | None = None) -> list[Item]:
    """The first `limit` (default: the suite's default_n) items of built-in suite `name`; with
    `categories`, the first `limit` items whose category is one of them (default: all such items
    among the suite's first default_n)."""
    suite = BUILTIN_SUITES.get(name)
    if suite is None:
        raise UsageError(f"unknown built-in suite {name!r}; known: {', '.join(BUILTIN_SUITES)}")
    if limit is not None and limit < 0:
        raise UsageError(f"--limit must be >= 0, got {limit}")
    if not categories:
        n = suite.default_n if limit is None else limit
        if suite.distinct is not None and n > suite.distinct:
            raise UsageError(f"built-in suite {name!r} has {suite.distinct:,} items with distinct prompts, "
                             f"asked for {n:,}: generated prompts are never repeated")
        return [suite.make(name, seed, i) for i in range(n)]
    head = [suite.make(name, seed, i) for i in range(suite.default_n)]  # also names the categories
    known = {item.category for item in head}
    unknown = sorted(set(categories) - known)
    if unknown:
        raise UsageError(f"built-in suite {name!r} has no category {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(sorted(known))}")
    wanted = set(categories)
    out = [item for item in head if item.category in wanted]
    if limit is None:
        return out
    i, end = suite.default_n, min(MAX_SCAN, suite.distinct or MAX_SCAN)
    while len(out) < limit and i < end:
        item = suite.make(name, seed, i)
        if item.category in wanted:
            out.append(item)
        i += 1
    if len(out) < limit and i == suite.distinct:
        raise UsageError(f"built-in suite {name!r} has {len(out):,} items of {', '.join(categories)} among its "
                         f"{suite.distinct:,} items with distinct prompts, asked for {limit:,}: generated "
                         "prompts are never repeated")
    return out[:limit]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvqual suites`: list the built-ins, or write one to a JSONL file."""
    parser.add_argument("--write", metavar="NAME", help="write built-in suite NAME as JSONL")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    parser.add_argument("--limit", type=int, default=None, help="number of items")
    parser.add_argument("-o", "--output", metavar="FILE", help="output file ('-' for stdout)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")


def run(args: argparse.Namespace) -> int:
    """`kvqual suites`: print the built-ins and profiles, or write one suite (--write)."""
    if args.write is None:
        print(f"{'suite':<13} {'items':>5} {'distinct':>9}  {'scorer':<12} probes")
        for s in BUILTIN_SUITES.values():
            distinct = f"{s.distinct:,}" if s.distinct is not None else "-"
            print(f"{s.name:<13} {s.default_n:>5} {distinct:>9}  {s.scorer:<12} {s.description}")
        for profile, mix in PROFILES.items():
            total = sum(n for _, n, _ in mix)
            print(f"profile {profile} ({total} items): "
                  + ", ".join(f"{n}×{k}" + (f"[{','.join(c)}]" if c else "") for k, n, c in mix))
        return 0
    if not args.output:
        raise UsageError("--write needs -o FILE (or -o - for stdout)")
    lines = "".join(dumps_line(item.to_json()) for item in generate(args.write, seed=args.seed, limit=args.limit))
    if args.output == "-":
        sys.stdout.write(lines)
        return 0
    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} exists; pass --force to overwrite it")
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(lines)
    return 0
