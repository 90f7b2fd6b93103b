"""The exceptions kvqual raises. Only the CLI turns them into messages and exit codes.

    KvqualError                   base; exit code 2 unless a subclass says otherwise
    ├── UsageError                bad command-line use                         (exit 2)
    ├── ConfigError               kvqual.toml invalid: names file and key       (exit 2)
    ├── SuiteError                suite file invalid: names file and line       (exit 2)
    ├── MismatchError             the two arms do not run what the config says  (exit 2)
    ├── LoadFileError             a --speed-from load.json missing, invalid, without a ratio, or
    │                             of other targets: names the file               (exit 2)
    ├── CalibrationError          `kvqual calibrate`: the "known-bad" is not worse than the
    │   │                         "known-good" on a token criterion              (exit 2)
    │   └── CalibrationUndecided  both ordered, but their intervals overlap: more items or a
    │                             worse known-bad would separate them            (exit 3)
    ├── ServerContractError       a server dropped data kvqual needs            (exit 4)
    │   └── EchoDisagreement      its echo logprobs of its own output disagree   (exit 4; compare
    │                             keeps going without token criteria for it)
    └── InfrastructureError       a target unreachable, too many failed requests (exit 4)
        ├── LaunchError           a launched server did not come up / go down   (exit 4)
        └── InvalidResponse       one answer is not data (non-finite logprob, over the size
                                  cap, another model's): that request failed; the run goes on

Anything else that escapes a command is a bug in kvqual: the CLI exits 70 (`cli.INTERNAL_ERROR`)
with one line and the traceback in a log file, never 1 (a FAIL).

No message kvqual stores or prints carries a configured API key: `Target.api_key()` registers
what it resolves (`register_secret`); failure messages (`retry.classify`) and what the CLI
prints pass through `redact`.
"""

from __future__ import annotations

from typing import Any


class KvqualError(Exception):
    """Base of every error kvqual reports to the user."""

    exit_code = 2


class UsageError(KvqualError):
    exit_code = 2


class CalibrationError(KvqualError):
    """The configs given as known-good and known-bad are not that pair on a token criterion: the
    input is wrong, not the sample size (exit 2)."""

    exit_code = 2


class CalibrationUndecided(CalibrationError):
    """Known-good below known-bad, but their intervals overlap: like an INCONCLUSIVE verdict, more
    data would decide it (exit 3)."""

    exit_code = 3


class ConfigError(KvqualError):
    """kvqual.toml is invalid. The message names the file and the key."""

    exit_code = 2

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path, self.key, self.problem = path, key, problem
        super().__init__(f"{path}: {key}: {problem}")


class SuiteError(KvqualError):
    """A suite file is invalid. The message names the file and the line."""

    exit_code = 2

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        self.path, self.line, self.problem = path, line, problem
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")


class MismatchError(KvqualError):
    """The arms of a comparison do not run what the config says (models, KV dtypes)."""

    exit_code = 2


class LoadFileError(KvqualError):
    """The load.json `compare --speed-from` reads is missing, unreadable, not a load.json, holds no
    ratio, or measured other targets than the compare's. The message names the file."""

    exit_code = 2

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


class InfrastructureError(KvqualError):
    """A target is unreachable, or too many requests failed to trust the run."""

    exit_code = 4


class ServerContractError(InfrastructureError):
    """A server answered, but without data kvqual needs (e.g. no echo logprobs)."""

    exit_code = 4


class LaunchError(InfrastructureError):
    """A server kvqual launched did not become healthy, or would not stop."""

    exit_code = 4


class EchoDisagreement(ServerContractError):
    """A server's echo (prompt) logprobs of its own greedy output disagree with the logprobs it
    reported while generating: teacher-forced metrics from it would be noise. `compare` catches
    it, records the refusal and judges on the generation criteria; elsewhere it is exit 4."""

    def __init__(self, message: str, mean_abs: float, cause: str) -> None:
        super().__init__(message)
        self.mean_abs, self.cause = mean_abs, cause


class InvalidResponse(InfrastructureError):
    """A server answered one request with something that is not data: a non-finite logprob, a
    body over the size cap, an answer from another model than the one asked for. Unlike a
    `ServerContractError` it does not stop the run: the request is recorded as failed with this
    reason (and counted in the failed rates); only if it escapes is it exit 4."""

    exit_code = 4


# ---------------------------------------------------------------- secrets in messages

REDACTED = "***"
MIN_SECRET_LEN = 8  # shorter values ("EMPTY", "none", "x") are placeholders, and scrubbing them would garble text
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a credential this process sends, so that `redact` removes it from every message."""
    if value and len(value) >= MIN_SECRET_LEN:
        _secrets.add(value)


def registered_secrets() -> list[str]:
    """The credentials registered so far, for a helper process that scrubs what it writes (watchdog.py)."""
    return sorted(_secrets)


def redact(text: str) -> str:
    """`text` with every registered credential replaced by `***` (apply before truncating)."""
    for secret in sorted(_secrets, key=len, reverse=True):  # a key that contains another goes first
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_json(value: Any) -> Any:
    """`redact` through a JSON-like value (dicts, lists, strings), e.g. a server's self-report."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    return value
