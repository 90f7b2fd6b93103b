"""write_reports: the three files, the returned paths, re-rendering; $GITHUB_STEP_SUMMARY untouched."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from kvqual.errors import KvqualError
from kvqual.report import rerender, write_reports


def test_writes_three_files_and_returns_their_paths(report, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    paths = write_reports(report, tmp_path / "out")
    assert paths == {"md": tmp_path / "out/report.md", "html": tmp_path / "out/report.html",
                     "junit": tmp_path / "out/junit.xml"}
    assert paths["md"].read_text(encoding="utf-8").startswith("## kvqual: **FAIL**")
    assert "<!DOCTYPE html>" in paths["html"].read_text(encoding="utf-8")
    assert len(ET.parse(paths["junit"]).getroot().findall(".//testcase")) == 7


def test_leaves_github_step_summary_to_the_cli(report, tmp_path, monkeypatch):
    # the CLI appends report.md once per command (tests/test_compare.py); a library call never does
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    write_reports(report, tmp_path / "a")
    assert summary.read_text(encoding="utf-8") == "earlier step\n"


def test_same_input_same_bytes(report, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    a, b = write_reports(report, tmp_path / "a"), write_reports(report, tmp_path / "b")
    for key in a:
        assert a[key].read_bytes() == b[key].read_bytes()


def test_rejects_unknown_schema(report, tmp_path):
    with pytest.raises(KvqualError, match="schema_version 2"):
        write_reports(dict(report, schema_version=2), tmp_path)


def test_rerender_from_saved_report_json(report, tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report), encoding="utf-8")
    paths = rerender(saved)
    assert paths["html"] == tmp_path / "report.html" and paths["html"].exists()
    with pytest.raises(KvqualError, match="cannot read report"):
        rerender(tmp_path / "missing.json")
