"""What a request asks of the generation engine and what it answers (`SamplingParams`, `Generation`, the
callbacks), and the counters it keeps for /metrics (`EngineStats`). serve/engine.py re-exports these names."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from kvqual.serve.sampling import TokenLogprob


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the engine; `logprobs` is the top-k count (None: no logprobs)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    echo: bool = False
    cache_salt: str | None = None  # vLLM's: only requests with the same salt share cached prefix blocks

    @property
    def reads_prefix_cache(self) -> bool:
        """Prompt scoring (echo with logprobs) computes every position fresh, as vLLM v1 skips prefix
        hits for prompt_logprobs requests; everything else may start from cached blocks."""
        return not (self.echo and self.logprobs is not None)


@dataclass(frozen=True)
class Generation:
    """The engine's answer for one prompt."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    text: str
    finish_reason: Literal["stop", "length"]
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None
    output_logprobs: tuple[TokenLogprob, ...] | None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache (None: no prefix cache)


Callback = Callable[[Generation | BaseException], None]
# Called on the engine thread for every token as it is generated: (token id, its logprobs
# when asked for, the finish reason when this token ends the request).
TokenHook = Callable[[int, TokenLogprob | None, Literal["stop", "length"] | None], None]


@dataclass
class EngineStats:
    """Counters exported by /metrics (written by the engine thread, read by HTTP)."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_running_reqs: int = 0
    num_queued_reqs: int = 0
    kv_cache_bytes_in_use: int = 0
    kv_tokens_in_use: int = 0  # tokens whose K/V running requests hold (padding not counted)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))

    def gen_throughput(self, horizon_s: float = 10.0) -> float:
        """Generated tokens per second over the last `horizon_s` seconds."""
        now = time.monotonic()
        tokens = sum(n for t, n in list(self.recent) if now - t <= horizon_s)
        return tokens / horizon_s
