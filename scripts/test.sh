#!/usr/bin/env bash
# Lint and run the test suite (what CI runs, after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=10 "$@"  # the 10 slowest, so CI logs show where time goes
