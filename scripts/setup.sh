#!/usr/bin/env bash
# Create .venv and install aiayn (editable) with every extra (serve, plot, evidence, document, parse,
# tensorboard), its test tools and the benchmarks' peers. Safe to re-run.
# As root with apt-get, also installs Debian's chromium for the browser test of the web page
# (skip with AIAYN_NO_BROWSER=1; without it that one test is skipped, with a message).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt torch
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[all,dev,bench]"
if [ -z "${AIAYN_NO_BROWSER:-}" ] && ! command -v chromium >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the browser test (AIAYN_NO_BROWSER=1 skips this)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "could not install chromium: the browser test will be skipped"
fi
