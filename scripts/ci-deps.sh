#!/usr/bin/env bash
# System packages the test suite needs beyond the venv: Debian's `chromium`, which the
# report test opens report.html in (tests/report/test_browser.py; with $CI set a missing
# browser fails that test instead of skipping it). Skipped when /usr/bin/chromium exists.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "ci-deps: chromium already installed ($(/usr/bin/chromium --version 2>/dev/null || echo unknown version))"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "ci-deps: need root or sudo to install chromium" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium
/usr/bin/chromium --version
