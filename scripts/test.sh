#!/usr/bin/env bash
# Command 2 of README (and what CI runs): set up if needed, lint and type-check, then run the
# whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/mypy --no-error-summary
exec .venv/bin/python -m pytest -q "$@"
