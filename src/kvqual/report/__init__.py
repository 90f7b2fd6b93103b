"""Reports attached to a config change: report.json, report.md (PR comment), report.html, junit.xml.

Pure rendering of the compare step's report dict (report.json, schema 1): no network, no
server, and the same dict always gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from kvqual.errors import KvqualError
from kvqual.report.html import render_html
from kvqual.report.junit import render_junit
from kvqual.report.markdown import GITHUB_COMMENT_LIMIT, render_markdown
from kvqual.report.summary import SCHEMA_VERSION
from kvqual.store import write_json_atomic

__all__ = [
    "GITHUB_COMMENT_LIMIT",
    "render_html",
    "render_junit",
    "render_markdown",
    "rerender",
    "write_all",
    "write_reports",
]


def write_reports(report: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write report.md, report.html and junit.xml into out_dir. Returns {"md", "html", "junit"} →
    paths. (The CLI, not this, appends report.md to $GITHUB_STEP_SUMMARY: once per command.)"""
    version = report.get("schema_version")
    if version != SCHEMA_VERSION:
        raise KvqualError(f"report schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(report)
    paths = {"md": out_dir / "report.md", "html": out_dir / "report.html", "junit": out_dir / "junit.xml"}
    paths["md"].write_text(markdown, encoding="utf-8")
    paths["html"].write_text(render_html(report), encoding="utf-8")
    paths["junit"].write_text(render_junit(report), encoding="utf-8")
    return paths


def rerender(report_json: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Re-render the reports from a saved report.json (for `kvqual report`)."""
    path = Path(report_json)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise KvqualError(f"{path}: cannot read report: {exc}") from exc
    return write_reports(report, out_dir if out_dir is not None else path.parent)


def write_all(report: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """report.json (written whole or not at all) and the reports rendered from it. Returns
    {"json", "md", "html", "junit"} → paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "report.json", report)
    return {"json": out_dir / "report.json", **write_reports(report, out_dir)}
