"""Where a result came from: kvqual's git revision and the versions of the packages involved."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

_PACKAGES = ("kvqual", "openai", "numpy", "scipy", "statsmodels", "lm-eval", "torch", "transformers")


@functools.cache
def git_revision() -> str | None:
    """The commit of the kvqual checkout in use (None for an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.cache
def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
