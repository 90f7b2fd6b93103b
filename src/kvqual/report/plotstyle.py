"""The figures' palette and styles, and a figure as a PNG data URI (stable bytes): what every
figure of report.html shares (report/plots.py re-exports these names)."""

from __future__ import annotations

import base64
import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

BASE, CAND, FLOOR, BOUND = "#1f77b4", "#ff7f0e", "#555555", "#c0392b"
PASS_ZONE = "#e3f1e6"
FLOOR_STYLE = {"color": FLOOR, "linestyle": "--", "linewidth": 1.6}
BOUND_STYLE = {"color": BOUND, "linestyle": "--", "linewidth": 1.4}
STATUS_COLOR = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#d4a000", "not_evaluated": "#8c959f"}
DPI = 100


def to_data_uri(fig: Figure | None) -> str | None:
    """A figure as a base64 PNG data URI (no metadata, so stable bytes); None passes through."""
    if fig is None:
        return None
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values or [] if isinstance(v, (int, float)) and not isinstance(v, bool)]
