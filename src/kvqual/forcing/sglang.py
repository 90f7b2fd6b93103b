"""Teacher forcing on SGLang: score token ids through its native `/generate` with prompt logprobs.

SGLang's OpenAI `/v1/completions` cannot stand in for vLLM's echo: it has no
`return_tokens_as_token_ids`, its logprob tokens are text and its `text_offset` is always -1
(entrypoints/openai/utils.py `to_openai_style_logprobs`), and its code warns that echo with logprobs
belongs on `/generate`. So `SglangForcer.score_ids` asks the native API (sgl-project/sglang, read 2026):

- request (managers/io_struct.py `GenerateReqInput`): `input_ids`, `sampling_params`
  `{"max_new_tokens": 0, "temperature": 0}` (sampling/sampling_params.py `verify` accepts 0: a
  prefill-only request, as SGLang's own logprob tests send), `return_logprob`, `logprob_start_len: 0`
  (the default -1 returns output logprobs only), `top_logprobs_num`, `return_text_in_logprobs: false`;
- answer (managers/tokenizer_manager.py `add_logprob_to_meta_info` / `detokenize_logprob_tokens`):
  `meta_info.input_token_logprobs` is one `[logprob, token_id, text or null]` per prompt position from
  `logprob_start_len` on; the first logprob is null, whatever the start
  (managers/scheduler_output_processor_mixin.py: `[None] + input_token_logprobs[:-1]`), and
  `input_top_logprobs` has the same length, null first, then `top_logprobs_num` entries of the same
  triple, best first.

They become kvqual's `TokenLogprobs` in vLLM's `return_tokens_as_token_ids` conventions
(`client.token_id_of`): tokens `"token_id:<id>"`, `token_ids` set from the ids SGLang reports (so
`_force_ids` checks them against what was sent), top-k maps keyed the same way, position 0 None / {}.

Prompts: the base `prompt_ids` is kept. SGLang's `/tokenize` (alias of `/v1/tokenize`,
entrypoints/openai/protocol.py `TokenizeRequest`) takes `prompt` or, in current releases, `messages`,
rendered by the chat endpoint's own `_process_messages` with the generation prompt always added; the
`add_generation_prompt` field the base sends is accepted and ignored (`extra="allow"`). Older SGLang
takes `prompt` only: chat items are then left out with the base's reason.

Scoring through the cache (`step`, on by default): SGLang scores a sequence in one prefill, whose
attention reads the K/V it has just computed, never what the KV cache stores, so an fp8_e4m3 cache scores
a completion bit for bit as bf16 does (measured on 0.5.17, docs/gpu.md "Blind scoring"). Decoding reads
every earlier token's K/V back from the cache. So `score_ids` scores a completion in steps of `step`
tokens, each step one request that holds the sequence up to the step's last token and asks logprobs from
the position before its first scored token (`logprob_start_len`). SGLang matches a request's prefix in
its radix cache up to its `logprob_start_len` (managers/schedule_batch.py `_compute_max_prefix_len`) and
caches a finished request's ids (mem_cache/radix_cache.py `cache_finished_req`), so every step after the
first finds the previous steps' tokens in the cache, as the cache stores them: the query that scores a
token attends to everything before it through the cache, but for the step's own up to `step` freshly
computed positions (with `step` 1: all but itself, as in decoding, where the query's own K/V is read
back too). The answer's `meta_info.cached_tokens` says how much of each prefix was matched; a step that
found less than it asked for (evicted, or a server whose radix cache is off, or that does not insert
finished requests: `--disable-radix-cache`, `--enable-deterministic-inference`) scored its tokens against
recomputed K/V, and is counted (`cache_missed`). It costs one request per `step` tokens, one after the
other within a completion.

Generated token ids: SGLang's OpenAI endpoints give them only through `return_token_ids: true`
(protocol.py `CompletionRequest` / `ChatCompletionRequest`; the choice then carries `token_ids`, the
native `output_ids`, and `prompt_token_ids`). kvqual's client sends it beside vLLM's
`return_tokens_as_token_ids` when the probe detects SGLang, and reads `choices[0].token_ids`
(`client._with_choice_token_ids`), so chat and completions items alike are forced by exact ids.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvqual.client import TOKEN_ID_PREFIX
from kvqual.errors import ServerContractError
from kvqual.forced import FAILED
from kvqual.forcing.teacher import TeacherForcer, concat_parts, whole_part
from kvqual.records import TokenLogprobs


CACHE_STEP = 1  # tokens scored a request when scoring through the cache (`[run] sglang_score_step`; 0: one prefill)


def score_payload(ids: list[int], top_logprobs: int, start: int = 0) -> dict[str, Any]:
    """SGLang /generate body that scores the positions of `ids` from `start` (the first comes back
    None) and generates nothing."""
    return {
        "input_ids": list(ids),
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": max(0, top_logprobs),
        "return_text_in_logprobs": False,
    }


def _triple(entry: Any, server: str) -> tuple[float | None, int]:
    if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not isinstance(entry[1], int) \
            or isinstance(entry[1], bool) or not (entry[0] is None or isinstance(entry[0], (int, float))):
        raise ServerContractError(f"{server}: /generate logprob entry is not [logprob, token_id, text]: "
                                  f"{str(entry)[:100]}")
    return (None if entry[0] is None else float(entry[0])), entry[1]


def cached_tokens(data: Mapping[str, Any] | list[Any]) -> int | None:
    """`meta_info.cached_tokens` of a /generate answer: the prefix tokens matched in the radix cache."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, Mapping) else None
    n = meta.get("cached_tokens") if isinstance(meta, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def parse_scores(data: Mapping[str, Any] | list[Any], want_top: int, server: str = "server") -> TokenLogprobs:
    """`meta_info.input_token_logprobs` (+ `input_top_logprobs`) of a /generate answer as
    TokenLogprobs with `token_id:<id>` tokens; missing or malformed logprobs are a contract error."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, Mapping) else None
    entries = meta.get("input_token_logprobs") if isinstance(meta, Mapping) else None
    if not isinstance(entries, list) or not entries:
        raise ServerContractError(f"{server}: /generate returned no input_token_logprobs (teacher forcing on "
                                  "SGLang needs return_logprob with logprob_start_len 0; pass "
                                  "--no-teacher-forcing to skip it)")
    pairs = [_triple(e, server) for e in entries]
    tops: list[Mapping[str, float]] = [{} for _ in pairs]
    if want_top > 0:
        raw = meta.get("input_top_logprobs")
        if not isinstance(raw, list) or len(raw) != len(pairs):
            raise ServerContractError(f"{server}: /generate returned {len(raw) if isinstance(raw, list) else 'no'} "
                                      f"input_top_logprobs for {len(pairs)} positions")
        for i, position in enumerate(raw):
            if position is not None:
                tops[i] = {f"{TOKEN_ID_PREFIX}{tid}": lp for lp, tid in (_triple(e, server) for e in position)
                           if lp is not None}
    return TokenLogprobs(tokens=tuple(f"{TOKEN_ID_PREFIX}{tid}" for _, tid in pairs),
                         token_logprobs=tuple(lp for lp, _ in pairs), top_logprobs=tuple(tops),
                         token_ids=tuple(tid for _, tid in pairs))


class SglangForcer(TeacherForcer):
    """TeacherForcer whose id scoring goes through SGLang's native /generate (the text path and
    prompt rendering are the base's), through the cache in steps of `step` tokens (0: in one prefill)."""

    def __init__(self, *args: Any, step: int = CACHE_STEP, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step = step

    async def _generate(self, ids: list[int], start: int) -> tuple[TokenLogprobs, int | None] | str:
        body = score_payload(ids, self.top_logprobs, start)
        sent = await self._send(lambda: self.transport.post_json("/generate", body, at_root=True))  # NaN refused
        if sent.failure is not None:
            return f"{FAILED}: {sent.failure.message}"  # "HTTP 4xx: body", with any key scrubbed before the cut
        return parse_scores(sent.value, self.top_logprobs, self.base_url), cached_tokens(sent.value)  # type: ignore[arg-type]

    async def score_ids(self, ids: list[int]) -> TokenLogprobs | str:
        """Logprobs of every position of `ids` (position 0 None), tokens as ids, in one prefill; or
        why not (a request that failed for good). A malformed answer is a contract error, as in the base."""
        got = await self._generate(ids, 0)
        return got if isinstance(got, str) else got[0]

    async def _score_window(self, prompt: list[int], completion: list[int], a: int, start: int,
                            end: int) -> TokenLogprobs | str:
        """prompt + completion[a:end] scored through the cache (module doc): the logprobs of
        completion[start:end], `step` tokens a request, or why not."""
        first = len(prompt) + start - a  # the first scored position of the sequence sent
        if self.step <= 0 or first < 1:
            return await super()._score_window(prompt, completion, a, start, end)
        context = prompt + completion[a:end]
        parts: list[TokenLogprobs] = []
        for s in range(first, len(context), self.step):
            e = min(len(context), s + self.step)
            got = await self._generate(context[:e], s - 1)
            if isinstance(got, str):
                return got
            echo, cached = got
            if echo.token_ids is None or tuple(echo.token_ids) != tuple(context[s - 1:e]):
                return "the server echoed other token ids than were sent"
            if s > first and (cached is None or cached < s - 1):
                self.cache_missed += e - s  # scored against recomputed K/V: the prefix was not (all) in the cache
            self.cache_scored += e - s
            parts.append(TokenLogprobs(tokens=echo.tokens[1:], token_logprobs=echo.token_logprobs[1:],
                                       top_logprobs=echo.top_logprobs[1:], token_ids=echo.token_ids[1:]))
        return whole_part(concat_parts(parts), end - start)
