"""Real GPU engines (vLLM, SGLang): what kvqual reads from them, and the gate on them.

Run on a GPU host, with the servers of a kvqual config up (docs/gpu.md: scripts/gpu/up.sh for
vLLM, scripts/gpu/up-sgl.sh for SGLang):

    KVQUAL_GPU_CONFIG=scripts/gpu/kvqual-sgl.toml KVQUAL_GPU_AA="sgl_bf16 sgl_bf16b" \
    KVQUAL_GPU_FP8=sgl_fp8 python -m pytest -m gpu tests/gpu

KVQUAL_GPU_AA names two servers of one config (the A/A pair: its compare must PASS) and
KVQUAL_GPU_FP8 a server with an fp8 KV cache and the same KV memory as the pair's first.
Skipped where torch sees no GPU or KVQUAL_GPU_CONFIG is unset (CI has no GPU).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = os.environ.get("KVQUAL_GPU_CONFIG")
AA = os.environ.get("KVQUAL_GPU_AA", "").split()
FP8 = os.environ.get("KVQUAL_GPU_FP8")


def _gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no driver: no GPU
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (CONFIG and _gpu()), reason="needs a GPU and KVQUAL_GPU_CONFIG (docs/gpu.md)")]


def _config():
    from kvqual.config import load_config

    assert CONFIG is not None
    return load_config(CONFIG)


def _describe(name: str) -> dict:
    from kvqual import probe

    t = _config().target(name)
    return asyncio.run(probe.describe(t.base_url, t.api_key(), timeout=30.0))


def _up() -> list[str]:
    """The config's targets whose servers answer now."""
    from kvqual.errors import KvqualError

    up = []
    for name in _config().targets:
        try:
            _describe(name)
            up.append(name)
        except KvqualError:
            continue
    return up


def _kvqual(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # cwd moves
    env = {**os.environ, "CI": "true", "KVQUAL_CONFIG": str(Path(CONFIG).resolve()),  # type: ignore[arg-type]
           "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "kvqual", *args, "--out", str(tmp_path / "results")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)


def test_every_server_reports_what_kvqual_reads():
    """Engine, KV dtype (as configured), KV capacity and /metrics, from each server that is up."""
    from kvqual.compare.verify import _norm

    config, up = _config(), _up()
    assert up, f"no server of {CONFIG} answers"
    for name in up:
        info, target = _describe(name), config.target(name)
        assert info["engine"] in ("vllm", "sglang"), (name, info.get("engine"))
        assert info["metrics_available"], name
        assert (info["kv_capacity_tokens"] or 0) > 0, name
        reported = info["kv_cache_dtype"]
        assert reported and (_norm(reported) == _norm(target.kv_cache_dtype) or reported == "auto"), (name, reported)


@pytest.mark.skipif(len(AA) != 2 or not FP8, reason="KVQUAL_GPU_AA and KVQUAL_GPU_FP8 name the servers")
def test_the_same_kv_memory_doubles_the_capacity_for_fp8_and_the_split_says_so():
    from kvqual.capacity import kv_dtype, kv_memory_gib, split

    base, fp8 = _describe(AA[0]), _describe(FP8)  # type: ignore[arg-type]
    config = _config()
    cap = split(base["kv_capacity_tokens"], kv_dtype(config.target(AA[0]).kv_cache_dtype, base),
                fp8["kv_capacity_tokens"], kv_dtype(config.target(FP8).kv_cache_dtype, fp8),  # type: ignore[arg-type]
                kv_memory_gib(base), kv_memory_gib(fp8))
    assert cap is not None and cap["dtype_share"] == 2.0 and cap["same_budget"], cap


def test_sglang_scores_token_ids_through_generate_and_flushes_its_cache():
    """SGLang only: native /generate scores every position of an id sequence; /flush_cache answers."""
    from kvqual import probe
    from kvqual.forcing.sglang import SglangForcer

    config = _config()
    sgl = [n for n in _up() if _describe(n)["engine"] == "sglang"]
    if not sgl:
        pytest.skip("no SGLang server up")
    t = config.target(sgl[0])

    async def score() -> object:
        forcer = SglangForcer(t.base_url, t.api_key(), t.model or "", 5, 60.0, 4)
        try:
            return await forcer.score_ids([1, 2, 3, 4, 5, 6, 7, 8])
        finally:
            await forcer.aclose()

    scored = asyncio.run(score())
    assert not isinstance(scored, str), scored
    assert scored.token_ids == (1, 2, 3, 4, 5, 6, 7, 8)  # type: ignore[union-attr]
    assert scored.token_logprobs[0] is None and all(x is not None for x in scored.token_logprobs[1:])  # type: ignore[union-attr]
    assert asyncio.run(probe.flush_cache(t.base_url, t.api_key())) is True


TEXT = ("The committee met on a cold morning in March to review the proposal. After two hours of debate, "
        "the members agreed that the bridge should be repaired before the summer, and that the cost would be "
        "shared between the city and the province. The engineer in charge promised a first report by May.")


@pytest.mark.skipif(len(AA) != 2 or not FP8, reason="KVQUAL_GPU_AA and KVQUAL_GPU_FP8 name the servers")
def test_sglang_scoring_in_steps_reads_the_fp8_cache_where_one_prefill_cannot():
    """SGLang only (forcing/sglang.py): a text scored a token a request through the radix cache lines up
    with the same text scored in one prefill on the bf16 server (so the positions are right), finds every
    step's prefix cached, and on the fp8 server differs from bf16 (the scores read the fp8 cache)."""
    import numpy as np

    from kvqual.forcing.sglang import SglangForcer

    config = _config()
    if _describe(AA[0])["engine"] != "sglang" or _describe(FP8)["engine"] != "sglang":  # type: ignore[arg-type]
        pytest.skip("the A/A pair's first and the fp8 server are not SGLang")

    async def scores(name: str, step: int, ids: list[int]) -> tuple[np.ndarray, int, int]:
        t = config.target(name)
        forcer = SglangForcer(t.base_url, t.api_key(), t.model or "", 5, 60.0, 4, step=step)
        try:
            got = await forcer._score_window(ids[:8], ids[8:], 0, 0, len(ids) - 8)
        finally:
            await forcer.aclose()
        assert not isinstance(got, str), (name, step, got)
        return np.array(got.token_logprobs, dtype=float), forcer.cache_scored, forcer.cache_missed

    async def tokenize() -> list[int]:
        from kvqual.transport import Transport

        t = config.target(AA[0])
        tr = Transport(t.base_url, t.api_key(), timeout=30.0)
        try:
            got = await tr.post_json("/tokenize", {"model": t.model or "", "prompt": TEXT}, at_root=True)
        finally:
            await tr.aclose()
        return list(got["tokens"])

    ids = asyncio.run(tokenize())
    assert len(ids) > 40, ids
    one_bf16, _, _ = asyncio.run(scores(AA[0], 0, ids))
    step_bf16, scored, missed = asyncio.run(scores(AA[0], 1, ids))
    one_fp8, _, _ = asyncio.run(scores(FP8, 0, ids))  # type: ignore[arg-type]
    step_fp8, scored8, missed8 = asyncio.run(scores(FP8, 1, ids))  # type: ignore[arg-type]
    print(f"\n{len(ids) - 8} tokens; mean |logprob difference| (nats): bf16 stepped vs one prefill "
          f"{np.abs(step_bf16 - one_bf16).mean():.2e}; fp8 vs bf16 in one prefill {np.abs(one_fp8 - one_bf16).mean():.2e}, "
          f"stepped {np.abs(step_fp8 - step_bf16).mean():.2e}; missed bf16 {missed}/{scored}, fp8 {missed8}/{scored8}")
    assert scored == scored8 == len(ids) - 8 and missed == missed8 == 0
    assert np.abs(step_bf16 - one_bf16).mean() < 0.05  # one position off would be nats
    assert np.abs(step_fp8 - step_bf16).max() > 0  # the stepped scores read the fp8 cache


@pytest.mark.skipif(len(AA) != 2, reason="KVQUAL_GPU_AA names the A/A pair")
def test_an_unchanged_config_passes(tmp_path):
    """The gate's first duty on a real GPU: two servers of one config compared PASS (exit 0)."""
    r = _kvqual(tmp_path, "compare", *AA)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.skipif(len(AA) != 2 or not FP8, reason="KVQUAL_GPU_AA and KVQUAL_GPU_FP8 name the servers")
def test_an_fp8_compare_ends_in_a_verdict_not_a_fault(tmp_path):
    """bf16 → fp8 on the real engine: PASS, FAIL or INCONCLUSIVE with its report, never exit 2/4/70."""
    r = _kvqual(tmp_path, "compare", AA[0], FP8, "--max-minutes", "1.5")  # type: ignore[arg-type]
    assert r.returncode in (0, 1, 3), r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(next((tmp_path / "results").glob("compare-*/report.json")).read_text())
    assert report["verdict"]["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert report["capacity"]["same_budget"] is True, report["capacity"]
