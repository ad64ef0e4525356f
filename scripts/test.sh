#!/usr/bin/env bash
# Lint and run the test suite (what CI runs, after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
# Two test processes where there are two cores or more (pytest-xdist; a module's tests stay in one,
# so its fixtures are built once); on one core, one process. AIAYN_TEST_WORKERS overrides.
workers=${AIAYN_TEST_WORKERS:-$(( $(nproc) >= 2 ? 2 : 0 ))}
# The suite leaves out the heavy checks marked `long` (each beside a faster test of its concern);
# --long runs them too (about twice the time).
select=(-m "not long")
if [ "${1:-}" = "--long" ]; then
  select=()
  shift
fi
.venv/bin/python -m pytest -q -n "$workers" --dist loadscope --durations=10 "${select[@]}" "$@"  # the 10 slowest, so CI logs show where time goes
