"""Values that travel through the pipeline: items, token logprobs, samples, run manifests.

Every record is a frozen dataclass with `to_json()` / `from_json()` so that what lands on
disk (suite JSONL, samples.jsonl, manifest.json) round-trips exactly. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import re
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import Any, Literal, Mapping

Api = Literal["completions", "chat"]

SCHEMA_VERSION = 1


def _frozen_mapping(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value) if value else {}


# how engines state their limit when a prompt is too long (vLLM's renderer and engine, OpenAI, SGLang)
_LIMIT_PATTERNS = (re.compile(r"maximum context length is (\d+)", re.I),
                   re.compile(r"maximum model length of (\d+)", re.I),
                   re.compile(r"context length \((\d+) tokens\)", re.I),
                   re.compile(r"maximum context length of (\d+)", re.I))


# What a failure message says when the server answered and its answer was not data (retry.classify's
# "invalid response: …" with client.check_finite's or bodies.decode_json's words): the content failed,
# not the network. "answered by model …" and an oversized body are not among them.
_UNUSABLE = ("not a finite number", "malformed response:", "not a JSON number", "overflows to infinity")


def unusable_answer(message: str | None) -> bool:
    """Did this failure come from an answer whose content is not data (NaN or ±inf logprobs, a body
    that is not JSON), rather than from the network or a server that did not answer? A candidate's
    such answer is its own outcome, a broken prompt, never an infrastructure fault (gate/tail.py)."""
    return bool(message) and "invalid response:" in message and any(words in message for words in _UNUSABLE)


def refused_limit(message: str | None) -> int | None:
    """The context limit a server states when it refuses a prompt as too long (an HTTP 400 whose
    body says e.g. vLLM's "This model's maximum context length is 4096 tokens. However, you
    requested 1 output tokens and your prompt contains at least 4097 input tokens…", its engine's
    "The decoder prompt (length N) is longer than the maximum model length of M", SGLang's "The
    input (N tokens) is longer than the model's context length (M tokens)"); None otherwise."""
    if not message or "HTTP 4" not in message:
        return None
    for pattern in _LIMIT_PATTERNS:
        m = pattern.search(message)
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return None


@dataclass(frozen=True)
class Item:
    """One evaluation or training prompt (a line of a suite file).

    `prompt` items go to /v1/completions, `messages` items to /v1/chat/completions.
    Items without `answer` are sampled training prompts: compared by distribution only.
    `context_id` groups items built on one shared context (e.g. several questions about
    one long document), so error bars can be clustered.
    """

    id: str
    suite: str
    prompt: str | tuple[int, ...] | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    answer: str | None = None
    scorer: str | None = None
    scorer_params: Mapping[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    category: str | None = None
    context_id: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def api(self) -> Api:
        return "chat" if self.messages is not None else "completions"

    @cached_property
    def prompt_hash(self) -> str:
        """What this item sends, hashed (16 hex digits of sha256 over the prompt or the messages as
        canonical JSON): two items with the same prompt are one unit of evidence, not two. Made once
        an item (not a field: equality and the JSON form ignore it)."""
        sent = {"prompt": list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt,
                "messages": [dict(m) for m in self.messages] if self.messages is not None else None}
        return hashlib.sha256(json.dumps(sent, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]

    @property
    def scored(self) -> bool:
        """True for evaluation items (compared by score); False for training prompts."""
        return self.scorer is not None or self.answer is not None

    def to_json(self) -> dict[str, Any]:
        """The suite-file form of this item (the `suite` field is implied by the file)."""
        out: dict[str, Any] = {"id": self.id}
        if self.prompt is not None:
            out["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        for name in ("answer", "scorer", "max_tokens", "category", "context_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.scorer_params:
            out["scorer_params"] = dict(self.scorer_params)
        if self.meta:
            out["meta"] = dict(self.meta)
        return out


_VALUES = operator.methodcaller("values")


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token logprobs in one shape for both APIs.

    `top_logprobs[i]` maps the top-k alternative token strings at position i to their
    logprobs (it may hold fewer than k entries when tokens collide as strings).
    `token_ids` is present when the server returned them.
    """

    tokens: tuple[str, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[Mapping[str, float], ...] = ()
    text_offset: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def top_values(self) -> list[Any]:
        """Every top-k logprob, position after position (the maps' values chained, not copied). Made
        once an answer and cached (not a field: equality, `replace` and the JSON form ignore it):
        the finite check (`client.check_finite`) and the token row (`tokenstore.row_batch`) both
        read the 1,280 values of a 256 x top-5 answer, where each used to chain them itself."""
        return list(chain.from_iterable(map(_VALUES, self.top_logprobs)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": list(self.tokens),
            "token_logprobs": list(self.token_logprobs),
            "top_logprobs": list(self.top_logprobs),  # the maps as they are: json.dumps does not need copies
        }
        if self.text_offset is not None:
            out["text_offset"] = list(self.text_offset)
        if self.token_ids is not None:
            out["token_ids"] = list(self.token_ids)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TokenLogprobs":
        return cls(
            tokens=tuple(data["tokens"]),
            token_logprobs=tuple(data["token_logprobs"]),
            top_logprobs=tuple(dict(t) for t in data.get("top_logprobs") or ()),
            text_offset=tuple(data["text_offset"]) if data.get("text_offset") is not None else None,
            token_ids=tuple(data["token_ids"]) if data.get("token_ids") is not None else None,
        )


@dataclass(frozen=True)
class Sample:
    """One answer (or one failure) for one item and repeat: a line of samples.jsonl.

    `error` is None when the request succeeded; otherwise `text` is None and the sample
    must never be scored as an answer.
    """

    id: str
    suite: str
    repeat: int
    text: str | None
    finish_reason: str | None
    completion_tokens: int | None
    error: str | None
    prompt_tokens: int | None = None
    latency_s: float | None = None
    started_at: float | None = None  # unix time the (last) attempt started
    attempts: int = 1
    logprobs: TokenLogprobs | None = None
    score: float | None = None  # filled where the scorer is known at run time (lm-eval)
    ttft_s: float | None = None  # time to first token, streamed runs only
    itl_s: float | None = None  # mean time between later tokens ((last − first) / (n − 1)), streamed only
    base_url: str | None = None  # the replica that answered
    context_id: str | None = None  # items sharing a context form a cluster for error bars
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache (None: not reported)
    prompt_hash: str | None = None  # the item's prompt (or messages), hashed: items that send the same are one unit

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def does_not_fit(self) -> bool:
        """Refused because prompt + max_tokens exceed the server's context: not an answer and not a
        failure either (sending it again would be refused again); a compare leaves the item out of
        both arms and says so."""
        return self.error is not None and refused_limit(self.error) is not None

    @property
    def key(self) -> tuple[str, str, int]:
        """The pairing key: (suite, item id, repeat). Never pair by position."""
        return (self.suite, self.id, self.repeat)

    def to_json(self, logprobs: bool = True) -> dict[str, Any]:
        """The samples.jsonl line. Field by field, not `dataclasses.asdict`: that deep-copies every
        top-k map only to throw the copies away (half the runner's client CPU per request).
        `logprobs=False`: the line with `"logprobs": null` (they go to the token file), as
        `replace(self, logprobs=None).to_json()` without making that copy."""
        out = {name: getattr(self, name) for name in _SAMPLE_FIELDS}
        out["base_url"] = public_url(self.base_url)
        out["logprobs"] = self.logprobs.to_json() if logprobs and self.logprobs is not None else None
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Sample":
        kwargs = {k: v for k, v in data.items() if k in _SAMPLE_FIELD_SET}
        if kwargs.get("logprobs") is not None:
            kwargs["logprobs"] = TokenLogprobs.from_json(kwargs["logprobs"])
        elif _SAMPLE_REQUIRED <= kwargs.keys():
            # what `cls(**kwargs)` makes, without the frozen __init__'s object.__setattr__ per field
            # (half of reading a line: a judge at 20k items reads 45k of them)
            sample = object.__new__(cls)
            object.__setattr__(sample, "__dict__", {name: kwargs[name] if name in kwargs else default
                                                    for name, default in _SAMPLE_DEFAULTS})
            return sample
        return cls(**kwargs)  # a field missing: the TypeError that says which


_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))
_SAMPLE_FIELD_SET = frozenset(_SAMPLE_FIELDS)
_SAMPLE_REQUIRED = frozenset(f.name for f in dataclasses.fields(Sample) if f.default is dataclasses.MISSING
                             and f.default_factory is dataclasses.MISSING)
_SAMPLE_DEFAULTS = tuple((f.name, f.default) for f in dataclasses.fields(Sample))  # required ones are always given
assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(Sample))  # no factory to call


@dataclass(frozen=True)
class GenerationParams:
    """What every request of a run is sent with (items may override max_tokens)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 1234
    max_tokens: int = 256
    top_logprobs: int = 5
    repeats: int = 1
    stream: bool = False
    token_ids: bool = False  # ask for tokens as ids (vLLM's `return_tokens_as_token_ids`): exact teacher forcing

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.token_ids:  # runs from before the field keep their identity
            del out["token_ids"]
        return out


@dataclass(frozen=True)
class SuiteRef:
    """A suite as a run used it: name, where it came from, the hash of its content."""

    name: str
    source: str
    sha256: str
    n_items: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunManifest:
    """manifest.json: what ran, where, with which parameters and server-reported config."""

    run_id: str
    key: str  # content hash of (target identity, suites, params, limit, replicate)
    target: str
    base_urls: tuple[str, ...]
    model: str | None
    kv_cache_dtype: str | None  # as configured
    suites: tuple[SuiteRef, ...]
    params: GenerationParams
    limit: int | None
    replicate: int
    fraction: float  # share of items covered (an A/A replicate may cover fewer)
    concurrency: int
    # running: being written; partial: this round's units answered, later rounds to come (a sequential
    # compare); complete: every planned unit answered; incomplete: interrupted, or too many failed
    status: Literal["running", "partial", "complete", "incomplete"]
    started_at: float
    finished_at: float | None
    counts: Mapping[str, int]
    server_info: Mapping[str, Any] = field(default_factory=dict)
    server_metrics: Mapping[str, Any] | None = None  # Prometheus figures during the last session (telemetry.py)
    kvqual_version: str = ""
    git_revision: str | None = None
    packages: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["params"] = self.params.to_json()
        out["suites"] = [s.to_json() for s in self.suites]
        out["base_urls"] = [public_url(u) for u in self.base_urls]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunManifest":
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["params"] = GenerationParams(**data["params"])
        kwargs["suites"] = tuple(SuiteRef(**s) for s in data["suites"])
        kwargs["base_urls"] = tuple(data["base_urls"])
        return cls(**kwargs)


def public_url(url: str | None) -> str | None:
    """`url` without the `user:password@` a base_url may carry: the form kvqual writes to disk and
    prints (the credentials stay in the config, and in the requests)."""
    if not url or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}" if sep else url


def dumps_line(obj: Mapping[str, Any]) -> str:
    """One compact JSON line (UTF-8 kept readable), newline-terminated."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
