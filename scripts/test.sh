#!/usr/bin/env bash
# Command 2 of README (and what CI runs): set up if needed, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
