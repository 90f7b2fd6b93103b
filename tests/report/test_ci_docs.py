"""The example GitHub workflow works as copied: it passes the workflow schema, installs kvqual
from a repository (never a bare `pip install kvqual`), compares the base branch's serving config
with the PR's, asks for the permissions its steps need, publishes junit and the PR comment
through well-known actions, and its shell steps (run here with bash) do what they say."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvqual.config import load_config

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-workflow.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _steps() -> list[dict]:
    return _workflow()["jobs"]["kvqual"]["steps"]


def _step(name: str) -> dict:
    return next(s for s in _steps() if s.get("name") == name)


def _uses(action: str) -> dict:
    return next(s for s in _steps() if s.get("uses", "").split("@")[0] == action)


# ---------------------------------------------------------------- the workflow schema

def _schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("check_jsonschema") is None:
        if not os.environ.get("CI"):
            pytest.skip("check-jsonschema is not installed (pip install check-jsonschema); with $CI set this fails")
        pytest.fail("check-jsonschema is not installed, and $CI is set: the workflow schema check must run in CI")
    # the GitHub workflow schema is vendored in the package: no network
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_the_workflow_passes_the_github_workflow_schema():
    checked = _schema_check(WORKFLOW)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_schema_check_can_fail(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text(encoding="utf-8").replace("pull-requests: write", "pull-requests: writ"),
                      encoding="utf-8")
    checked = _schema_check(broken)
    assert checked.returncode == 1 and "pull-requests" in checked.stdout, checked.stdout + checked.stderr


# ---------------------------------------------------------------- install, base vs PR, permissions

def test_installs_kvqual_from_a_repository_never_from_a_bare_name():
    install = _step("Install kvqual")
    spec = install["env"]["INSTALL_FROM"]
    assert spec == "kvqual @ git+https://github.com/<owner>/kvqual@<ref>"
    assert 'python -m pip install "$INSTALL_FROM"' in install["run"]
    text = WORKFLOW.read_text(encoding="utf-8")
    bare = [line for line in text.splitlines()
            if re.search(r"pip install\s+[\"']?kvqual([\"'\[\s]|$)", line) and "Never" not in line]
    assert not bare, bare  # `pip install kvqual` installs nothing, or a package someone squatted


def _install(spec: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The install step's script under bash, with a `python` that records what it was asked."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "python").write_text('#!/bin/sh\necho "python $*"\n', encoding="utf-8")
    (stub / "python").chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "INSTALL_FROM": spec}
    return subprocess.run(["bash", "-e", "-c", _step("Install kvqual")["run"]], capture_output=True, text=True,
                          env=env, timeout=30)


def test_the_install_step_refuses_the_placeholder_and_installs_what_it_is_given(tmp_path):
    placeholder = _install(_step("Install kvqual")["env"]["INSTALL_FROM"], tmp_path)
    assert placeholder.returncode == 2 and "::error title=kvqual install::set INSTALL_FROM" in placeholder.stdout
    assert "python -m pip" not in placeholder.stdout
    real = _install("kvqual @ git+https://github.com/acme/kvqual@v0.1.0", tmp_path)
    assert real.returncode == 0, real.stderr
    assert real.stdout.strip() == "python -m pip install kvqual @ git+https://github.com/acme/kvqual@v0.1.0"
    wheel = _install("./wheels/kvqual-0.1.0-py3-none-any.whl", tmp_path)
    assert wheel.stdout.strip() == "python -m pip install ./wheels/kvqual-0.1.0-py3-none-any.whl"


def test_compares_the_base_branch_config_with_the_prs():
    checkouts = [s for s in _steps() if s.get("uses", "").startswith("actions/checkout@")]
    assert len(checkouts) == 2 and "with" not in checkouts[0]  # the PR, at the workspace root
    assert checkouts[1]["with"] == {"ref": "${{ github.event.pull_request.base.sha }}", "path": "base"}
    compare = _step("Compare baseline and candidate")["run"]
    assert "kvqual compare baseline candidate --config kvqual.toml" in compare and "set +e" in compare
    steps = [s.get("name") for s in _steps()]
    assert steps.index("Check out the base branch (baseline)") < steps.index("Compare baseline and candidate")


def test_the_kvqual_toml_in_the_header_is_a_valid_config_launching_each_branch(tmp_path):
    header = WORKFLOW.read_text(encoding="utf-8").split("\nname:")[0]
    toml = "\n".join(line.removeprefix("#   ") for line in header.splitlines()
                     if line.startswith("#   ") or line == "#")
    toml = toml[toml.index("[targets.baseline]"):]
    (tmp_path / "kvqual.toml").write_text(toml, encoding="utf-8")
    targets = load_config(tmp_path / "kvqual.toml").targets
    assert set(targets) == {"baseline", "candidate"}
    assert targets["baseline"].launch.startswith("bash base/serving/")  # the base branch's checkout
    assert targets["candidate"].launch.startswith("bash serving/")  # the PR's
    assert all("{port}" in t.launch and "{port}" in t.base_urls[0] for t in targets.values())


def test_permissions_are_the_ones_its_steps_need():
    assert _workflow()["permissions"] == {"contents": "read", "checks": "write", "pull-requests": "write"}
    assert "permissions" not in _workflow()["jobs"]["kvqual"]


def test_fork_pull_requests_do_not_run_on_the_gpu_runner():
    job = _workflow()["jobs"]["kvqual"]
    assert job["if"] == "github.event.pull_request.head.repo.full_name == github.repository"


# ---------------------------------------------------------------- publishing

def test_every_action_is_pinned_to_a_major_version():
    uses = [s["uses"] for s in _steps() if "uses" in s]
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", u) for u in uses), uses


def test_junit_is_published_as_a_check_whatever_the_verdict():
    publish = _uses("mikepenz/action-junit-report")
    assert publish["if"] == "always()"
    assert publish["with"]["report_paths"] == "results/compare-*/junit.xml"
    assert publish["with"]["fail_on_failure"] is False  # the verdict step applies the exit-3 policy


def test_the_report_is_posted_as_one_sticky_pr_comment():
    comment = _uses("marocchino/sticky-pull-request-comment")
    assert comment["with"] == {"header": "kvqual", "path": "results/compare-*/report.md"}
    assert comment["if"].startswith("always() && hashFiles('results/compare-*/report.md')")


def test_runs_on_pull_requests_changing_server_config():
    on = _workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert "serving/**" in on["pull_request"]["paths"]


def test_uploads_html_even_when_the_gate_fails():
    upload = _step("Upload the reports")
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    assert "results/compare-*/report.html" in upload["with"]["path"]
    steps = [s.get("name") for s in _steps()]
    assert steps[-1] == "Apply the verdict"  # decided last: nothing is skipped by a failing verdict


def test_no_workflow_variable_is_read_by_kvqual_as_an_option():
    env = {**_workflow()["jobs"]["kvqual"].get("env", {})}
    for step in _steps():
        env.update(step.get("env", {}))
    assert not [k for k in env if k.startswith("KVQUAL_")], env


# ---------------------------------------------------------------- the verdict step, run with bash

def _apply(code: str, strict: str = "false") -> subprocess.CompletedProcess[str]:
    script = _step("Apply the verdict")["run"].replace("${{ steps.gate.outputs.code }}", code)
    env = {"PATH": "/usr/bin:/bin", "STRICT_INCONCLUSIVE": strict}
    return subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, env=env, timeout=30)


def test_verdict_step_exit_codes():
    assert _apply("0").returncode == 0
    assert _apply("1").returncode == 1
    inconclusive = _apply("3")
    assert inconclusive.returncode == 0 and "::warning title=kvqual INCONCLUSIVE" in inconclusive.stdout
    assert _apply("3", strict="true").returncode == 3
    assert _apply("2").returncode == 2
    assert _apply("4").returncode == 4
    assert _apply("143").returncode == 143  # cancelled: the signal's code, never a pass
    assert _apply("").returncode == 4  # the gate step died before writing its code


def test_the_gate_step_records_kvqual_exit_code(tmp_path):
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "kvqual").write_text("#!/bin/sh\nexit 3\n", encoding="utf-8")
    (stub / "kvqual").chmod(0o755)
    out = tmp_path / "github_output"
    env = {"PATH": f"{stub}:/usr/bin:/bin", "GITHUB_OUTPUT": str(out)}
    gate = subprocess.run(["bash", "-e", "-c", _step("Compare baseline and candidate")["run"]], env=env,
                          capture_output=True, text=True, timeout=30)
    assert gate.returncode == 0 and out.read_text(encoding="utf-8") == "code=3\n"


def test_docs_explain_inconclusive_and_junit_mapping():
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    for needle in ("exit 3", "INCONCLUSIVE", "GITHUB_STEP_SUMMARY", "<skipped", "<failure",
                   "examples/github-workflow.yml", "scripts/ci-deps.sh", "STRICT_INCONCLUSIVE",
                   "mikepenz/action-junit-report", "pull-requests: write", "checks: write"):
        assert needle in text, needle
