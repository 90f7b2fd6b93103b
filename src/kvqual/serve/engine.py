"""The generation engine: one worker thread, continuous batching over a bf16/fp8 KV cache.

Requests arriving within a short window (or while others run) are admitted up to
`max_batch` and the KV capacity. Each new request is prefilled on its own (no padding, so
prompt scoring does not depend on the batch), then joins the running batch, left-padded
with an attention mask (into spare rows of the cache when it is no longer than the batch,
so that joining copies only itself); every step decodes one token for every running
request; finished requests leave at once. Greedy outputs can still differ with batch composition through
float32 reduction order (measured in docs/serve.md).

With a prefix cache (off by default; prefixcache.py) a prefill starts from the K/V of the prompt's
longest cached prefix (never for echo with logprobs: prompt scoring computes every position) and
computes only the rest; the prompt's full blocks are cached after it, and the cache is kept within
the KV capacity left after running requests' reservations. A flush is answered on this thread,
in arrival order with the requests.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from kvqual.serve.dtypes import FP8_FAULTS
from kvqual.serve.generation import Callback, EngineStats, Generation, SamplingParams, TokenHook
from kvqual.serve.kvcache import KvCache, KvCacheDtype, KvFault, KvScale
from kvqual.serve.model import LoadedModel
from kvqual.serve.prefixcache import BLOCK_SIZE, PrefixCache, block_keys
from kvqual.serve.sampling import TokenLogprob, choose_token, make_generator, token_logprobs

LOGIT_CHUNK = 256  # positions per lm_head call when scoring a whole prompt

log = logging.getLogger(__name__)


@dataclass
class _Row:
    """Mutable state of one running request (engine thread only)."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    callback: Callback
    gen: torch.Generator
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    prefix_hit: int = 0  # prompt tokens whose K/V came from the prefix cache
    text: str = ""
    finish_reason: Literal["stop", "length"] | None = None
    on_token: TokenHook | None = None


@dataclass(frozen=True)
class _Flush:
    """A /flush_cache or /reset_prefix_cache request, answered on the engine thread in arrival order."""

    only_if_idle: bool
    done: Callable[[bool], None]


class Engine:
    """Owns the model's forward passes; `submit` is thread-safe, results come via callbacks."""

    def __init__(
        self,
        loaded: LoadedModel,
        kv_cache_dtype: KvCacheDtype,
        kv_scale: KvScale,
        max_batch: int,
        context_length: int,
        kv_capacity_tokens: int,
        batch_window_s: float = 0.005,
        kv_fault: KvFault = "none",
        prefix_cache: PrefixCache | None = None,
    ):
        self.loaded = loaded
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_scale = kv_scale
        self.kv_fault = kv_fault
        self._layer_fault: KvFault = kv_fault if kv_fault in FP8_FAULTS else "none"
        self.prefix_cache = prefix_cache  # None: off (the default); engine thread only, like the batch
        self.max_batch = max_batch
        self.context_length = context_length
        self.kv_capacity_tokens = kv_capacity_tokens
        self.batch_window_s = batch_window_s
        self.stats = EngineStats()
        self._decoder = loaded.model.get_decoder()
        self._lm_head = loaded.model.get_output_embeddings()
        tok = loaded.tokenizer
        eos = loaded.model.generation_config.eos_token_id
        self._eos = {tok.eos_token_id} | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self._eos.discard(None)
        self._inbox: queue.Queue = queue.Queue()
        self._pending: collections.deque[_Row] = collections.deque()
        self._rows: list[_Row] = []
        self._cache: KvCache | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvqual-serve-engine", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the worker thread; requests still queued get an error."""
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)

    def flush_cache(self, done: Callable[[bool], None], only_if_idle: bool = True) -> None:
        """Empty the prefix cache on the engine thread; `done(True)` there once it is empty, or
        `done(False)` when `only_if_idle` and requests are running or queued (SGLang's /flush_cache).
        Running requests hold their own K/V, so `only_if_idle=False` is always safe (vLLM's reset)."""
        self._inbox.put(_Flush(only_if_idle, done))

    def submit(
        self,
        prompt_ids: list[int] | tuple[int, ...],
        params: SamplingParams,
        callback: Callback,
        on_token: TokenHook | None = None,
    ) -> None:
        """Queue one prompt; `callback` runs on the engine thread with a Generation or an exception,
        and `on_token` (if given) there too after each generated token, before `callback`."""
        row = _Row(tuple(prompt_ids), params, callback, make_generator(params.seed), on_token=on_token)
        self._inbox.put(row)

    # ---- worker thread ---------------------------------------------------------------

    def _loop(self) -> None:
        # Subnormal float32 arithmetic is ~8x slower on CPU and this model produces it; flush to zero.
        torch.set_flush_denormal(True)
        with torch.inference_mode():
            while not self._stop.is_set():
                self._collect()
                if self._stop.is_set():
                    break
                self._admit()
                if self._rows:
                    try:
                        self._decode_step()
                    except Exception as exc:  # a broken batch fails its requests, not the server
                        for row in self._rows:
                            row.callback(exc)
                        self._rows, self._cache = [], None
                self._update_gauges()
        for row in list(self._pending) + self._rows:
            row.callback(RuntimeError("server shutting down"))
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Flush):
                item.done(False)
            elif item is not None:
                item.callback(RuntimeError("server shutting down"))

    def _collect(self) -> None:
        """Move arrivals to the pending queue: block when idle, then wait a short window."""
        if not self._rows and not self._pending:
            item = self._inbox.get()
            if item is None or isinstance(item, _Flush):
                self._take(item)
                return
            self._pending.append(item)
            deadline = time.monotonic() + self.batch_window_s
            while len(self._pending) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._inbox.get(timeout=left)
                except queue.Empty:
                    break
                self._take(item)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def _take(self, item: _Row | _Flush | None) -> None:
        """One inbox item: a request joins the pending queue; a flush is answered now, in arrival order."""
        if isinstance(item, _Flush):
            idle = not self._rows and not self._pending
            flushed = idle or not item.only_if_idle
            if flushed and self.prefix_cache is not None:
                self.prefix_cache.flush()
            self._update_gauges()  # what a refusal reports
            item.done(flushed)
        elif item is not None:
            self._pending.append(item)

    def _reserved(self, row: _Row) -> int:
        return len(row.prompt_ids) + row.params.max_tokens

    def _admit(self) -> None:
        """Prefill pending requests while the batch and the KV capacity allow; the new rows join the
        running batch together (one copy of the cache, however many arrive)."""
        self._update_gauges()
        fresh: list[KvCache] = []
        while self._pending and len(self._rows) < self.max_batch:
            row = self._pending[0]
            in_use = sum(self._reserved(r) for r in self._rows)
            if self._rows and in_use + self._reserved(row) > self.kv_capacity_tokens:
                break
            self._pending.popleft()
            self.stats.requests_total += 1
            self.stats.prompt_tokens_total += len(row.prompt_ids)
            try:
                cache = self._prefill(row, self.kv_capacity_tokens - in_use - self._reserved(row))
            except Exception as exc:
                row.callback(exc)
                continue
            if row.finish_reason is not None:
                self._finish(row)
            else:
                self._rows.append(row)
                fresh.append(cache)
        if not fresh:
            return
        if self._cache is None:
            self._cache = fresh.pop(0)
        if fresh:
            self._cache.extend_rows(*fresh)

    def _hidden(self, input_ids, position_ids, attention_mask, cache: KvCache) -> torch.Tensor:
        out = self._decoder(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
        )
        return out.last_hidden_state

    def _prefill(self, row: _Row, room: int) -> KvCache:
        """Run the prompt alone through a fresh cache (after the K/V of its longest cached prefix, when
        the prefix cache is on; `room`: tokens of the KV budget it may keep); score it if echo asks;
        pick the first token."""
        n = len(row.prompt_ids)
        loaded = self.loaded
        cache = KvCache(loaded.num_layers, self.kv_cache_dtype, self.kv_scale, self._layer_fault)
        store, keys, start = self.prefix_cache, [], 0
        if store is not None:
            keys = block_keys(row.prompt_ids, row.params.cache_salt)
            hit = store.lookup(keys, n) if row.params.reads_prefix_cache else None
            store.fit(room, keep=hit.entry_id if hit else None)  # room for this request first
            if hit is not None:
                cache.load_prefix(hit.kv, hit.scales, loaded.model.dtype, n)
                start = row.prefix_hit = hit.tokens
        ids = torch.tensor([row.prompt_ids[start:]], dtype=torch.long)
        positions = torch.arange(start, n).unsqueeze(0)
        mask = torch.ones((1, n), dtype=torch.long)
        hidden = self._hidden(ids, positions, mask, cache)[0]
        row.cached = n
        if store is not None and keys:
            store.insert(keys, *cache.stored_prefix(len(keys) * BLOCK_SIZE))
            store.fit(room)
        k = row.params.logprobs
        if row.params.echo and k is not None:
            scored: list[TokenLogprob | None] = [None]
            for start in range(0, n - 1, LOGIT_CHUNK):
                stop = min(n - 1, start + LOGIT_CHUNK)
                logp = self._lm_head(hidden[start:stop]).float().log_softmax(-1)
                scored.extend(token_logprobs(logp, ids[0, start + 1 : stop + 1], k))
            row.prompt_logprobs = tuple(scored)
        if row.params.max_tokens == 0:
            row.finish_reason = "length"
            return cache
        self._append_token(row, self._lm_head(hidden[-1:]).float())
        return cache

    def _append_token(self, row: _Row, logits: torch.Tensor) -> None:
        """Choose a token from [1, V] logits, record it and its logprobs, and check for the end."""
        params = row.params
        token = choose_token(logits[0], params.temperature, params.top_p, row.gen)
        row.output_ids.append(token)
        if params.logprobs is not None:
            logp = logits.log_softmax(-1)
            row.output_logprobs.extend(token_logprobs(logp, torch.tensor([token]), params.logprobs))
        self.stats.generation_tokens_total += 1
        self._check_end(row, token)
        if row.on_token is not None:
            self._notify(row, token)

    def _check_end(self, row: _Row, token: int) -> None:
        """Set the finish reason and final text if `token` ends the request (stop string, EOS, length)."""
        params = row.params
        tokenizer = self.loaded.tokenizer
        if params.stop:
            text = tokenizer.decode(row.output_ids, skip_special_tokens=True)
            hits = [text.find(s) for s in params.stop if s and s in text]
            if hits:
                row.text, row.finish_reason = text[: min(hits)], "stop"
                return
        if token in self._eos:
            row.finish_reason = "stop"
        elif len(row.output_ids) >= params.max_tokens or len(row.prompt_ids) + len(row.output_ids) >= self.context_length:
            row.finish_reason = "length"
        if row.finish_reason is not None:
            row.text = tokenizer.decode(row.output_ids, skip_special_tokens=True)

    def _notify(self, row: _Row, token: int) -> None:
        """Call the row's token hook; one that fails is dropped (its request still runs to the end)."""
        assert row.on_token is not None
        entry = row.output_logprobs[-1] if row.params.logprobs is not None else None
        try:
            row.on_token(token, entry, row.finish_reason)
        except Exception:
            log.exception("token hook failed; dropping it")
            row.on_token = None

    def _decode_step(self) -> None:
        """Feed every running row its last token, pick the next, and retire finished rows."""
        assert self._cache is not None
        rows, cache = self._rows, self._cache
        width = cache.length()
        input_ids = torch.tensor([[r.output_ids[-1]] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.cached] for r in rows], dtype=torch.long)
        mask = torch.zeros((len(rows), width + 1), dtype=torch.long)
        for i, r in enumerate(rows):
            mask[i, width - r.cached :] = 1
        hidden = self._hidden(input_ids, positions, mask, cache)
        logits = self._lm_head(hidden[:, -1, :]).float()
        for i, r in enumerate(rows):
            r.cached += 1
            self._append_token(r, logits[i : i + 1])
        self.stats.recent.append((time.monotonic(), len(rows)))
        keep = [i for i, r in enumerate(rows) if r.finish_reason is None]
        for r in rows:
            if r.finish_reason is not None:
                self._finish(r)
        if not keep:
            self._rows, self._cache = [], None
            return
        if len(keep) < len(rows):
            self._rows = [rows[i] for i in keep]
            # always drop the common left padding: extra padding is masked, but it changes float
            # rounding, which bf16/fp8 storage turns into visible logprob noise (measured 2e-2)
            cache.retire(keep, cache.length() - max(r.cached for r in self._rows))

    def _finish(self, row: _Row) -> None:
        assert row.finish_reason is not None
        result = Generation(
            prompt_ids=row.prompt_ids,
            output_ids=tuple(row.output_ids),
            text=row.text,
            finish_reason=row.finish_reason,
            prompt_logprobs=row.prompt_logprobs,
            output_logprobs=tuple(row.output_logprobs) if row.params.logprobs is not None else None,
            cached_tokens=row.prefix_hit if self.prefix_cache is not None else None,
        )
        row.callback(result)

    def _update_gauges(self) -> None:
        self.stats.num_running_reqs = len(self._rows)
        self.stats.num_queued_reqs = len(self._pending) + self._inbox.qsize()
        self.stats.kv_cache_bytes_in_use = self._cache.nbytes() if self._cache is not None else 0
        self.stats.kv_tokens_in_use = sum(r.cached for r in self._rows)
