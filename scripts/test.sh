#!/usr/bin/env bash
# Command 2 of README (and what CI runs): set up if needed, lint and type-check, then run the
# whole test suite. Extra arguments go to pytest (after ours: `-n 0` runs it in one process;
# PYTEST_XDIST_AUTO_NUM_WORKERS=N sets how many workers `auto` means).
# -n auto: one pytest-xdist worker per core; most tests wait on child processes that import
# torch, so the suite is CPU-bound and scales with the cores. Tests go to the workers one by
# one in collection order (--dist load; the longest modules collected first, or
# --dist worksteal, were slower: docs/benchmarks/suite.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/mypy --no-error-summary
exec .venv/bin/python -m pytest -q -n auto --dist load "$@"
