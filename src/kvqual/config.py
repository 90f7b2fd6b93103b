"""kvqual.toml → validated targets, run defaults and gate policy.

Every problem is reported as one `ConfigError` naming the file and the key. Without a
config file, the built-in targets `bf16`, `fp8` and `fp8_e5m2` run on kvqual's own
reference server (`kvqual serve`), launched by kvqual on a free port.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlparse

from kvqual.errors import ConfigError, register_secret
from kvqual.records import public_url

if TYPE_CHECKING:
    from kvqual.gate import GatePolicy

DEFAULT_CONFIG_NAME = "kvqual.toml"
# kv_cache_dtype takes any engine's name (SGLang fp8_e4m3, vLLM fp8, llama.cpp f16 / q8_0 / q4_0, …):
# a word of letters, digits, "_", "." or "-"; compare/verify.py knows which names are aliases.
KV_CACHE_DTYPE_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,32}")
BUILTIN_SOURCE = "<built-in targets: kvqual serve>"
OPENAI_HOST = "api.openai.com"  # the one host OPENAI_API_KEY goes to without `api_key_env`
NO_KEY = "EMPTY"  # what OpenAI-compatible servers without auth accept (vLLM's and SGLang's docs use it)


@dataclass(frozen=True)
class Target:
    """One server configuration to evaluate (an arm of a comparison)."""

    name: str
    base_urls: tuple[str, ...]  # `/v1` roots; several = replicas the runner spreads across
    model: str | None = None  # None: the first id from /v1/models
    api_key_env: str | None = None
    launch: str | None = None  # command kvqual starts (and stops) around a run
    kv_cache_dtype: str | None = None  # as expected; verified against the server's report
    tokenizer: str | None = None  # local tokenizer folder, for teacher-forcing chat items
    launch_timeout: float = 900.0
    pinned_identity: Mapping[str, Any] | None = None  # identity before {port} was filled
    cold: bool = False  # every request gets a cache_salt of its own: a prefix-caching server computes it fresh

    @property
    def base_url(self) -> str:
        return self.base_urls[0]

    def api_key(self) -> str:
        """The API key from the environment variable `api_key_env` names; without one, OPENAI_API_KEY
        for a target on OpenAI's own API only, so the user's key never goes to another server.
        Never stored; registered so that no failure message carries it (errors.redact)."""
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
        elif all(urlparse(u).hostname == OPENAI_HOST for u in self.base_urls):
            key = os.environ.get("OPENAI_API_KEY", "") or NO_KEY
        else:
            key = NO_KEY
        register_secret(key)
        return key

    def with_port(self, port: int) -> "Target":
        """This target with `{port}` filled in its launch command and base URLs."""
        fill = lambda s: s.replace("{port}", str(port))  # noqa: E731
        return replace(
            self,
            pinned_identity=self.identity(),
            base_urls=tuple(fill(u) for u in self.base_urls),
            launch=fill(self.launch) if self.launch else None,
        )

    def identity(self) -> dict[str, Any]:
        """What defines this target for run-folder hashing (no secrets, no port)."""
        if self.pinned_identity is not None:
            return dict(self.pinned_identity)
        out = {
            "name": self.name,
            "base_urls": [public_url(u) for u in self.base_urls],
            "model": self.model,
            "launch": self.launch,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
        if self.cold:  # targets from before the key keep their identity (and their finished runs)
            out["cold"] = True
        return out

    def cache_salt(self, run_id: str, key: tuple[str, str, int]) -> str | None:
        """The `cache_salt` of one request: for a cold target, one of its own (run, item, repeat),
        so no request ever reads another's cached blocks; None otherwise (the shared namespace)."""
        if not self.cold:
            return None
        return f"kvqual-cold:{run_id}:{key[0]}:{key[1]}:{key[2]}"


@dataclass(frozen=True)
class RunDefaults:
    """The `[run]` table: defaults for every run (command-line flags override them)."""

    suites: tuple[str, ...] = ()
    concurrency: int = 32
    max_tokens: int = 256
    top_logprobs: int = 5
    seed: int = 1234
    temperature: float = 0.0
    top_p: float = 1.0
    timeout: float = 600.0
    retries: int = 5
    # no answer for this long while requests wait: ask the server's /health; three failed asks end the work as an
    # infrastructure fault (exit 4) instead of every request's timeout × retries (liveness.py; 0: never ask)
    stall_seconds: float = 120.0
    repeats: int = 1
    limit: int | None = None
    aa_fraction: float = 0.25  # share of items the A/A generation replicate covers (docs/statistics.md)
    max_items: int | None = None  # compare budget: items judged at most (None: every item of the suites)
    # compare budget, server time: a round starts only if, at the rate so far, it ends within this many minutes
    # (0 or None: no limit). 30 never binds a GPU server's 1,984-item pool (a few minutes); the built-in CPU
    # targets use 5 (their first look of 124 items takes about four)
    max_minutes: float | None = 30.0
    budget_tokens: int | None = None  # compare budget: no new round after this many generated tokens (all arms)
    results_dir: str = "results"
    max_failed_rate: float = 0.05  # a run above this stops as an infrastructure failure
    stream: bool = False
    serve_together: bool | None = None  # compare: both servers up at once (None: when kvqual launches none, or built-in)
    speed_from: str | None = None  # compare: a `kvqual load` load.json (or its folder) the speedup criterion reads
    # SGLang: teacher forcing scores a completion through the KV cache, this many tokens a request (0: in one
    # prefill, which never reads the cache: blind to its dtype; > 1: cheaper, but the tokens after a step's first
    # also read K/V just computed, so the drift is understated and the report says so; forcing/sglang.py, docs/gpu.md)
    sglang_score_step: int = 1


@dataclass(frozen=True)
class Config:
    path: str  # the file it came from, or BUILTIN_SOURCE
    targets: Mapping[str, Target]
    run: RunDefaults
    gate: "GatePolicy"
    builtin: bool = False

    def target(self, name: str) -> Target:
        if name not in self.targets:
            known = ", ".join(sorted(self.targets)) or "none"
            raise ConfigError(self.path, f"targets.{name}", f"no such target (known: {known})")
        return self.targets[name]


_TARGET_TYPES: dict[str, tuple[type, ...]] = {
    "base_url": (str, list),
    "model": (str,),
    "api_key_env": (str,),
    "launch": (str,),
    "kv_cache_dtype": (str,),
    "tokenizer": (str,),
    "launch_timeout": (int, float),
    "cold": (bool,),
}


def _type_name(types: tuple[type, ...]) -> str:
    names = {str: "a string", list: "a list of strings", int: "an integer", float: "a number",
             bool: "true or false", tuple: "a list"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def _check_type(path: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ConfigError(path, key, f"expected {_type_name(types)}, got {type(value).__name__} {value!r}")


def _check_url(path: str, key: str, url: str) -> str:
    probe = url.replace("{port}", "1")
    parsed = urlparse(probe)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(path, key, f"not an http(s) URL: {url!r}")
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ConfigError(path, key, f"malformed port in URL: {url!r}") from None
    return url.rstrip("/")


def _parse_target(path: str, name: str, table: Any) -> Target:
    prefix = f"targets.{name}"
    if not isinstance(table, dict):
        raise ConfigError(path, prefix, "expected a table")
    for key, value in table.items():
        if key not in _TARGET_TYPES:
            raise ConfigError(path, f"{prefix}.{key}", f"unknown key (known: {', '.join(_TARGET_TYPES)})")
        _check_type(path, f"{prefix}.{key}", value, _TARGET_TYPES[key])
    if "base_url" not in table:
        raise ConfigError(path, f"{prefix}.base_url", "missing (the server's /v1 root, e.g. http://127.0.0.1:30000/v1)")
    raw_urls = table["base_url"] if isinstance(table["base_url"], list) else [table["base_url"]]
    if not raw_urls:
        raise ConfigError(path, f"{prefix}.base_url", "empty list")
    urls = []
    for u in raw_urls:
        _check_type(path, f"{prefix}.base_url", u, (str,))
        urls.append(_check_url(path, f"{prefix}.base_url", u))
        register_secret(urlparse(u.replace("{port}", "1")).password)  # user:password@host: never in a message
    dtype = table.get("kv_cache_dtype")
    if dtype is not None and not KV_CACHE_DTYPE_PATTERN.fullmatch(dtype):
        raise ConfigError(path, f"{prefix}.kv_cache_dtype",
                          f"{dtype!r} is not a KV dtype name (e.g. bf16, fp8_e4m3, fp8, f16, q8_0)")
    launch = table.get("launch")
    if launch is not None:
        try:
            if not shlex.split(launch):
                raise ValueError("empty command")
        except ValueError as exc:
            raise ConfigError(path, f"{prefix}.launch", f"cannot be split like a shell would: {exc}") from None
    if any("{port}" in u for u in urls) and not launch:
        raise ConfigError(path, f"{prefix}.base_url", "uses {port} but the target has no launch command")
    return Target(
        name=name,
        base_urls=tuple(urls),
        model=table.get("model"),
        api_key_env=table.get("api_key_env"),
        launch=launch,
        kv_cache_dtype=dtype,
        tokenizer=table.get("tokenizer"),
        launch_timeout=float(table.get("launch_timeout", Target.launch_timeout)),
        cold=bool(table.get("cold", False)),
    )


def _parse_run(path: str, table: Any) -> RunDefaults:
    if not isinstance(table, dict):
        raise ConfigError(path, "run", "expected a table")
    known = {f.name: f for f in fields(RunDefaults)}
    types: dict[str, tuple[type, ...]] = {
        "suites": (list,), "concurrency": (int,), "max_tokens": (int,), "top_logprobs": (int,),
        "seed": (int,), "temperature": (int, float), "top_p": (int, float), "timeout": (int, float),
        "retries": (int,), "stall_seconds": (int, float), "repeats": (int,), "limit": (int,), "aa_fraction": (int, float),
        "results_dir": (str,), "max_failed_rate": (int, float), "stream": (bool,),
        "max_items": (int,), "max_minutes": (int, float), "budget_tokens": (int,), "serve_together": (bool,),
        "speed_from": (str,), "sglang_score_step": (int,),
    }
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(path, f"run.{key}", f"unknown key (known: {', '.join(known)})")
        _check_type(path, f"run.{key}", value, types[key])
        values[key] = value
    if "suites" in values:
        for s in values["suites"]:
            _check_type(path, "run.suites", s, (str,))
        values["suites"] = tuple(values["suites"])
    run = RunDefaults(**values)
    validate_run(run, path, prefix="run.")
    return run


def validate_run(run: RunDefaults, source: str, prefix: str = "--") -> None:
    """Range checks shared by the config file and command-line overrides."""
    sep = "." if prefix == "run." else ""
    name = (lambda k: f"{prefix}{k}") if sep else (lambda k: f"{prefix}{k.replace('_', '-')}")
    checks = [
        ("concurrency", run.concurrency >= 1, "must be at least 1"),
        ("max_tokens", run.max_tokens >= 1, "must be at least 1"),
        ("top_logprobs", 0 <= run.top_logprobs <= 20, "must be between 0 and 20 (servers cap top-k at 20)"),
        ("temperature", run.temperature >= 0, "must be >= 0"),
        ("top_p", 0 < run.top_p <= 1, "must be in (0, 1]"),
        ("timeout", run.timeout > 0, "must be > 0 seconds"),
        ("retries", run.retries >= 0, "must be >= 0"),
        ("stall_seconds", run.stall_seconds >= 0, "must be >= 0 seconds (0: never ask)"),
        ("repeats", run.repeats >= 1, "must be at least 1"),
        ("limit", run.limit is None or run.limit >= 1, "must be at least 1"),
        ("aa_fraction", 0 <= run.aa_fraction <= 1, "must be between 0 and 1"),
        ("max_failed_rate", 0 <= run.max_failed_rate <= 1, "must be between 0 and 1"),
        ("max_items", run.max_items is None or run.max_items >= 2, "must be at least 2"),
        ("max_minutes", run.max_minutes is None or run.max_minutes >= 0, "must be >= 0 (0: no limit)"),
        ("budget_tokens", run.budget_tokens is None or run.budget_tokens >= 1, "must be at least 1"),
        ("sglang_score_step", run.sglang_score_step >= 0, "must be >= 0 (0: score in one prefill, blind to the cache)"),
    ]
    checks.append(("results_dir", not os.path.exists(run.results_dir) or os.path.isdir(run.results_dir),
                   "must be a folder (a file of that name exists)"))
    for key, ok, problem in checks:
        if not ok:
            where = "--out" if key == "results_dir" and not sep else name(key)  # the flag is --out
            raise ConfigError(source, where, f"{problem} (got {getattr(run, key)!r})")


# the hierarchical cache at the default KV budget (256 MB: 11.6K bf16 tokens) holds fewer tokens than
# the `cache` profile's shared documents and the running requests need, so entries move to the host tier
_HICACHE = " --enable-hierarchical-cache"
# prefix caching alone at 256 MB keeps almost nothing: 32 concurrent ~1.1K-token probe prompts reserve
# the whole budget and evict every entry before its next use (measured: 11 of 36 later questions warm);
# 1 GB (46.6K bf16 tokens) holds the probe's documents beside the running requests
_PREFIX = " --enable-prefix-caching --kv-budget-mb 1024"

BUILTIN_TARGETS: tuple[tuple[str, str, str], ...] = (
    ("bf16", "bf16", ""), ("fp8", "fp8_e4m3", ""), ("fp8_e5m2", "fp8_e5m2", ""),
    ("fp8_broken", "fp8_e4m3", " --kv-fault ignore-scale-on-read"),
    ("bf16_prefix", "bf16", _PREFIX),
    ("bf16_hicache", "bf16", _HICACHE),
    ("fp8_hicache", "fp8_e4m3", _HICACHE),
    ("bf16_prefix_broken", "bf16", _PREFIX + " --kv-fault stale-cache-block"),
)


BUILTIN_MAX_MINUTES = 5.0  # the embedded default on 2 CPU cores: one look of 124 items (~4 min), unless more fits


def builtin_targets() -> dict[str, Target]:
    """bf16 / fp8 (e4m3) / fp8_e5m2 on the reference server, launched on a free port; and
    `fp8_broken`, e4m3 with a kernel that ignores the scale on read (`--kv-fault
    ignore-scale-on-read`): a silent field failure, reported as fp8_e4m3, that a comparison must FAIL.
    The cache paths (docs/cache.md): `bf16_prefix` (prefix cache on), `bf16_hicache` / `fp8_hicache`
    (the hierarchical cache: evicted blocks go to a host tier and come back), and
    `bf16_prefix_broken` (a warm hit reads stale blocks: the cache-path probe must FAIL)."""
    py = shlex.quote(sys.executable)
    targets = {}
    for name, dtype, extra in BUILTIN_TARGETS:
        targets[name] = Target(
            name=name,
            base_urls=("http://127.0.0.1:{port}/v1",),
            launch=f"{py} -m kvqual serve --kv-cache-dtype {dtype}{extra} --port {{port}}",
            kv_cache_dtype=dtype,
            # the interpreter's path is not part of what was run: `kvqual` and `python -m kvqual`
            # (or another checkout's venv) must find the same finished runs
            pinned_identity={"name": name, "builtin": f"kvqual serve --kv-cache-dtype {dtype}{extra}",
                             "kv_cache_dtype": dtype},
        )
    return targets


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load `path`, else ./kvqual.toml, else the built-in targets."""
    from kvqual.gate import GatePolicy

    if path is None:
        if not Path(DEFAULT_CONFIG_NAME).is_file():
            return Config(BUILTIN_SOURCE, builtin_targets(), RunDefaults(max_minutes=BUILTIN_MAX_MINUTES), GatePolicy(),
                          builtin=True)
        path = DEFAULT_CONFIG_NAME
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(source, "-", "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "-", f"not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "-", f"cannot read: {exc}") from None

    for key in data:
        if key not in ("targets", "run", "gate"):
            raise ConfigError(source, key, "unknown table (known: targets, run, gate)")
    raw_targets = data.get("targets", {})
    if not isinstance(raw_targets, dict) or not raw_targets:
        raise ConfigError(source, "targets", "no targets defined (add [targets.NAME] with base_url)")
    targets = {name: _parse_target(source, name, table) for name, table in raw_targets.items()}
    run = _parse_run(source, data.get("run", {}))
    gate_table = data.get("gate", {})
    if not isinstance(gate_table, dict):
        raise ConfigError(source, "gate", "expected a table")
    gate = GatePolicy.from_mapping(gate_table, source)
    return Config(source, targets, run, gate)


@dataclass(frozen=True)
class Overrides:
    """Command-line values that replace `[run]` defaults (None = keep the default)."""

    values: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, run: RunDefaults) -> RunDefaults:
        present = {k: v for k, v in self.values.items() if v is not None}
        if "suites" in present:
            present["suites"] = tuple(present["suites"])
        updated = replace(run, **present)
        validate_run(updated, "command line")
        return updated
