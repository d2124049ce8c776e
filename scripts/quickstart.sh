#!/usr/bin/env bash
# Command 1 of README: set everything up, then scan the built-in example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/gpusync scan "$@"
