#!/usr/bin/env bash
# Lint and run the test suite (what CI runs, after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# Two test processes where there are two cores or more (pytest-xdist; a module's tests stay in one,
# so its fixtures are built once); on one core, one process. AIAYN_TEST_WORKERS overrides.
workers=${AIAYN_TEST_WORKERS:-$(( $(nproc) >= 2 ? 2 : 0 ))}
.venv/bin/python -m pytest -q -n "$workers" --dist loadscope --durations=10 "$@"  # the 10 slowest, so CI logs show where time goes
