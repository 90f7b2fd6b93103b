"""A real vLLM in the loop: `kvqual compare` of vLLM bf16 against vLLM fp8 (the CPU build, the
embedded default's weights), both started and stopped by kvqual through `launch` targets.

`bash scripts/setup-vllm.sh` installs vLLM in .venv-vllm and exports the model folder; .ci/run
does it, so in CI (CI=true) a missing vLLM fails this test instead of skipping it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# where setup-vllm.sh exported the model (the session's KVQUAL_CACHE_DIR is a test folder: conftest.py)
MODEL_DIR = Path(os.environ.get("KVQUAL_VLLM_MODEL") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "kvqual" / "hf" / "SmolLM2-135M-Instruct")


def _needs_vllm() -> None:
    if VLLM_PYTHON.is_file() and (MODEL_DIR / "config.json").is_file():
        return
    message = f"{VLLM_PYTHON} or {MODEL_DIR} is missing: run `bash scripts/setup-vllm.sh`"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _needs_fp8_kv_cpu() -> None:
    """vLLM's CPU build refuses an fp8 KV cache without AVX-512 or AMX ("FP8 KV cache on CPU requires
    x86 with AVX-512 or AMX."): on such a machine the candidate cannot start, whatever kvqual does."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return
    if "avx512f" not in flags and "amx_tile" not in flags:
        pytest.skip("this CPU has neither AVX-512 nor AMX: vLLM's CPU build cannot serve an fp8 KV cache here")


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_real_vllm_bf16_against_fp8(tmp_path):
    _needs_vllm()
    _needs_fp8_kv_cpu()
    script = ROOT / "scripts" / "vllm-cpu.sh"
    # a small mix with both APIs: chat items (the chat template, rendered by vLLM's /tokenize) and
    # completions items with text prompts
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
        {"id": f"t{i}", "prompt": f"Q: What is {a} plus {b}?\nA: The answer is", "answer": str(a + b),
         "scorer": "number", "max_tokens": 8} for i, (a, b) in enumerate([(2, 3), (4, 4), (1, 6), (5, 2), (3, 3), (7, 1)])
    ]))
    (tmp_path / "kvqual.toml").write_text(f"""
[targets.vllm_bf16]
base_url = "http://127.0.0.1:{{port}}/v1"
launch = "bash {script} --port {{port}} --kv-cache-dtype auto"
kv_cache_dtype = "bf16"
launch_timeout = 600

[targets.vllm_fp8]
base_url = "http://127.0.0.1:{{port}}/v1"
launch = "bash {script} --port {{port}} --kv-cache-dtype fp8"
kv_cache_dtype = "fp8"
launch_timeout = 600

[run]
suites = ["builtin:arith@10", "text.jsonl"]
max_tokens = 32
""")
    r = subprocess.run([sys.executable, "-m", "kvqual", "compare", "vllm_bf16", "vllm_fp8"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=1500, env={**os.environ, "CI": "true", "KVQUAL_VLLM_MODEL": str(MODEL_DIR)})
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr[-4000:]
    report = json.loads(next((tmp_path / "results").glob("compare-*/report.json")).read_text())
    runs = report["runs"]
    # the dtype was verified from vLLM's own vllm:cache_config_info, not taken from the config
    assert runs["baseline"]["engine"] == runs["candidate"]["engine"] == "vllm"
    assert runs["baseline"]["reported_kv_dtype"] == "auto" and runs["candidate"]["reported_kv_dtype"] == "fp8"
    # KV capacity of both arms (VLLM_CPU_KVCACHE_SPACE=1 GiB: fp8 holds twice the tokens)
    cap = report["capacity"]
    assert cap["baseline"] > 0 and cap["candidate"] == 2 * cap["baseline"] and cap["ratio"] == 2.0
    assert "KV capacity:" in r.stdout, r.stderr[-3000:]
    # token criteria evaluated on every pair, chat items included, by exact token ids
    tf = report["teacher_forcing"]
    assert tf["pairs"] == 16 and tf["usable"] == 16, tf
    assert tf["methods"] == {"ids": 16, "text": 0}
    assert runs["baseline"]["token_ids"] and runs["candidate"]["token_ids"]
    # both arms' windows planned against vLLM's own /v1/models max_model_len (8192 in vllm-cpu.sh), less echo's token
    assert tf["window_limit"] == {"baseline": 8191, "candidate": 8191}, tf
    kl = next(c for c in report["verdict"]["criteria"] if c["name"] == "kl_excess")
    assert kl["status"] != "not_evaluated" and kl["estimate"] is not None
    chat = report["suites"]["arith"]["teacher"]["ab"]
    assert chat["n_items"] == 10 and chat["mean_kl"] > 0  # fp8 K/V moves the distributions a little
    # both servers were stopped
    ports = [int(runs[a]["base_urls"][0].split(":")[2].split("/")[0]) for a in ("baseline", "candidate")]
    assert not any(_listening(p) for p in ports)
    assert r.stderr.count("kvqual: stopping vllm_") == 2
