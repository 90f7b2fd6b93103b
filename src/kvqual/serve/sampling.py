"""Per-token choices: greedy or seeded sampling, and the logprobs reported for a token.

Logprobs are always those of the model's raw distribution (log-softmax of the logits, before
temperature or top-p), as vLLM and SGLang report them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class TokenLogprob:
    """One token's logprob and its top-k alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator: seeded for reproducible sampling, else from fresh entropy."""
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def choose_token(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """Pick the next token from one row of logits: argmax at temperature 0, else nucleus sampling."""
    if temperature < GREEDY_EPS:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        keep = cumulative - sorted_probs < top_p  # always keeps the top token
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        pick = torch.multinomial(sorted_probs, 1, generator=gen)
        return int(order[pick].item())
    return int(torch.multinomial(probs, 1, generator=gen).item())


def token_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[TokenLogprob]:
    """For each row of log-softmaxed logits [N, V]: the logprob of token_ids[i] and the top-k."""
    chosen = logprobs.gather(1, token_ids.view(-1, 1)).squeeze(1).tolist()
    if k > 0:
        top_values, top_ids = torch.topk(logprobs, k, dim=-1)
        tops = [tuple(zip(ids, vals)) for ids, vals in zip(top_ids.tolist(), top_values.tolist())]
    else:
        tops = [() for _ in chosen]
    return [TokenLogprob(int(t), float(c), top) for t, c, top in zip(token_ids.tolist(), chosen, tops)]
