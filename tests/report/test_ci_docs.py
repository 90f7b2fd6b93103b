"""The example GitHub workflow: triggers on config changes, uploads the HTML, and its
verdict step (run here with bash) fails the job on FAIL and only warns on INCONCLUSIVE."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-workflow.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _step(name: str) -> dict:
    return next(s for s in _workflow()["jobs"]["kvqual"]["steps"] if s.get("name") == name)


def test_runs_on_pull_requests_changing_server_config():
    on = _workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert "serving/**" in on["pull_request"]["paths"]


def test_uploads_html_even_when_the_gate_fails():
    upload = _step("Upload the reports")
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    assert "results/**/report.html" in upload["with"]["path"]
    assert "set +e" in _step("Compare baseline and candidate")["run"]


def _apply(code: str, strict: str = "false") -> subprocess.CompletedProcess[str]:
    script = _step("Apply the verdict")["run"].replace("${{ steps.gate.outputs.code }}", code)
    env = {"PATH": "/usr/bin:/bin", "KVQUAL_STRICT_INCONCLUSIVE": strict}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)


def test_verdict_step_exit_codes():
    assert _apply("0").returncode == 0
    assert _apply("1").returncode == 1
    inconclusive = _apply("3")
    assert inconclusive.returncode == 0 and "::warning title=kvqual INCONCLUSIVE" in inconclusive.stdout
    assert _apply("3", strict="true").returncode == 3
    assert _apply("2").returncode == 2
    assert _apply("4").returncode == 4
    assert _apply("").returncode == 4  # the gate step died before writing its code


def test_docs_explain_inconclusive_and_junit_mapping():
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    for needle in ("exit 3", "INCONCLUSIVE", "GITHUB_STEP_SUMMARY", "<skipped", "<failure",
                   "examples/github-workflow.yml", "scripts/ci-deps.sh"):
        assert needle in text, needle
