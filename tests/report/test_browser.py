"""report.html in a real headless Chromium: the plots render and <script> model text stays text.

Skips only when Chromium is absent outside CI; with $CI set a missing browser is a failure
(scripts/ci-deps.sh installs Debian's `chromium`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from kvqual.report import write_reports

WIDTH, HEIGHT = 1200, 3000


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI: run scripts/ci-deps.sh")
        pytest.skip("chromium not installed (scripts/ci-deps.sh installs it)")
    return path


def _run(args: list[str], tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


class _DomScan(HTMLParser):
    """Collects start tags and visible text of a serialized DOM."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _count_color(pixels: np.ndarray, hex_color: str, alpha: float = 1.0, tol: float = 0.03) -> int:
    """Pixels of `hex_color` drawn at `alpha` over white (matplotlib's histogram fill)."""
    rgb = np.array([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]) * alpha + (1 - alpha)
    return int((np.abs(pixels[..., :3] - rgb) < tol).all(axis=-1).sum())


def _plot_pixels(report, tmp_path: Path) -> dict[str, int]:
    url = write_reports(report, tmp_path / "out")["html"].resolve().as_uri()
    shot = tmp_path / "shot.png"
    _run([f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}"], tmp_path, url)
    pixels = imread(shot)
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    # These colours appear only inside the matplotlib figures, never in the page CSS.
    return {
        "baseline histogram": _count_color(pixels, "#1f77b4", alpha=0.55),
        "candidate histogram": _count_color(pixels, "#ff7f0e", alpha=0.55),
        "candidate lines": _count_color(pixels, "#ff7f0e"),
        "right→wrong bars": _count_color(pixels, "#d62728"),
        "wrong→right bars": _count_color(pixels, "#2ca02c"),
    }


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture
def page(report, tmp_path) -> str:
    return write_reports(report, tmp_path / "out")["html"].resolve().as_uri()


def test_screenshot_shows_the_plots(report, tmp_path):
    counts = _plot_pixels(report, tmp_path)
    # measured on Chromium 156: ~5,200 / 5,300 / 380 / 42,600 / 28,100 pixels
    minimum = {"baseline histogram": 1000, "candidate histogram": 1000, "candidate lines": 100,
               "right→wrong bars": 5000, "wrong→right bars": 5000}
    assert {k: v >= minimum[k] for k, v in counts.items()} == dict.fromkeys(minimum, True), counts


def test_screenshot_check_sees_missing_plots(report, tmp_path):
    counts = _plot_pixels(dict(report, plots=None), tmp_path)
    assert counts == dict.fromkeys(counts, 0)


def test_script_in_model_output_is_text_and_never_runs(page, tmp_path):
    dom = _run(["--dump-dom"], tmp_path, page).stdout
    scan = _DomScan()
    scan.feed(dom)
    text = "".join(scan.text)
    assert "script" not in scan.tags  # no script element exists in the live DOM
    assert "b" not in scan.tags  # the model's <b> was not turned into markup either
    assert "Here is HTML: <script>alert(1)</script> oops" in text
    assert "Here is HTML: <b>bold</b> and the end." in text
    assert "FAIL" in text and "kvqual compare bf16 fp8 --limit 20" in text


def test_missing_chromium_skips_locally_but_fails_in_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is required in CI"):
        _chromium()
