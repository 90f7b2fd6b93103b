"""A bug in kvqual is never a verdict: an unexpected exception exits 70 with one line and the
traceback in a log file, never 1 (which CI reads as "the candidate failed")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvqual import cli
from kvqual.suites import generated


def test_an_unexpected_exception_exits_70_with_one_line_and_a_log(tmp_path, monkeypatch, capsys) -> None:
    def broken(args):
        raise RuntimeError("something kvqual did not expect\nsecond line")

    monkeypatch.setattr(generated, "run", broken)
    monkeypatch.setenv("KVQUAL_LOG_DIR", str(tmp_path))
    code = cli.main(["suites"])
    err = capsys.readouterr().err
    assert code == cli.INTERNAL_ERROR == 70
    assert err.count("\n") == 1 and "internal error (a bug in kvqual, not a verdict; exit 70)" in err
    assert "RuntimeError: something kvqual did not expect" in err and "second line" not in err
    log, = tmp_path.glob("crash-*.log")
    assert str(log) in err and "Traceback" in log.read_text() and "second line" in log.read_text()


def test_known_errors_keep_their_codes_and_a_real_process_exits_70_on_a_bug(tmp_path) -> None:
    # bad input is still 2, one line
    bad = subprocess.run([sys.executable, "-m", "kvqual", "suites", "--write", "nope", "-o", "-"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("kvqual: error:")
    # a crash in a real process (an import-time failure injected through sitecustomize)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import kvqual.suites.generated as g\n"
        "def boom(args):\n    raise ZeroDivisionError('division by zero')\n"
        "g.run = boom\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "KVQUAL_LOG_DIR": str(tmp_path / "logs")}
    r = subprocess.run([sys.executable, "-m", "kvqual", "suites"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 70, r.stderr
    assert "ZeroDivisionError: division by zero" in r.stderr and len(list(Path(tmp_path / "logs").glob("crash-*"))) == 1


def test_out_pointing_at_a_file_is_bad_input(tmp_path) -> None:
    (tmp_path / "afile").write_text("")
    r = subprocess.run([sys.executable, "-m", "kvqual", "compare", "bf16", "fp8", "--out", "afile"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--out: must be a folder (a file of that name exists)" in r.stderr


def test_a_missing_argument_is_one_line_and_exit_2() -> None:
    """Issue 53: `kvqual compare bf16` printed 14 lines of usage for one missing argument."""
    r = subprocess.run([sys.executable, "-m", "kvqual", "compare", "bf16"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr == ("kvqual compare: error: the following arguments are required: candidate "
                        "(see kvqual compare --help)\n"), r.stderr
