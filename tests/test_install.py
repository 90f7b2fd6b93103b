"""`pip install .` with no extras gives a CLI that works: a clean virtual environment (no torch, no
test packages), then `kvqual run`, `compare` and `report` against fake servers. The dependency
bounds in pyproject.toml are the versions this passed with. Slow (~1 min: pip resolves and installs
from the package index)."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from kvtest import start_fake, write_suite

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_clean_install_without_extras_runs_compares_and_reports(tmp_path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], capture_output=True, text=True,
                         timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert "torch==" not in listed and "statsmodels==" not in listed  # the runtime closure stays small
    kvqual = env_dir / "bin" / "kvqual"
    base, cand = start_fake("--kv-cache-dtype", "bf16"), start_fake("--kv-cache-dtype", "fp8_e4m3")
    try:
        write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Question {i}: [[answer={i}]] A:",
                                            "answer": str(i), "scorer": "exact"} for i in range(130)])
        (tmp_path / "kvqual.toml").write_text(
            f'[targets.base]\nbase_url = "{base.base_url}"\nkv_cache_dtype = "bf16"\n'
            f'[targets.cand]\nbase_url = "{cand.base_url}"\nkv_cache_dtype = "fp8_e4m3"\n'
            '[gate]\nmax_broken_share = 0.04\n')  # what 130 prompts can bound (1% takes ~400): the subject is the install
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVQUAL_", "PYTHON", "VIRTUAL_ENV"))}
        env["CI"] = "true"

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(kvqual), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)

        r = run("run", "base", "--suite", "s.jsonl")
        assert r.returncode == 0, r.stdout + r.stderr
        r = run("compare", "base", "cand", "--suite", "s.jsonl")
        assert r.returncode == 0 and r.stdout.startswith("PASS"), r.stdout + r.stderr
        base_run = next(p for p in (tmp_path / "results").iterdir() if p.name.startswith("base-") and "-aa" not in p.name)
        cand_run = next(p for p in (tmp_path / "results").iterdir() if p.name.startswith("cand-"))
        r = run("report", str(base_run), str(cand_run), "--out", "again")
        assert r.returncode == 0 and (tmp_path / "again" / "report.html").is_file(), r.stdout + r.stderr
    finally:
        base.stop()
        cand.stop()
