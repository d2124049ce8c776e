#!/usr/bin/env bash
# Create .venv with pinned, mutually compatible versions and install gpusync into it (editable).
# Idempotent: a second run only checks the stamp and returns.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.gpusync-setup
WANT=$(cat requirements/pinned.txt requirements/torchrec-nodeps.txt setup.cfg setup.py | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && .venv/bin/python -c "import gpusync, torchrec" 2>/dev/null; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# this machine's pip config names index folders that may be absent: drop only that notice
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"${PIP[@]}" -r requirements/pinned.txt
"${PIP[@]}" --no-deps -r requirements/torchrec-nodeps.txt
"${PIP[@]}" --no-deps --no-build-isolation -e . 2>/dev/null || "${PIP[@]}" --no-deps -e .
.venv/bin/python -c "import torch, fbgemm_gpu, torchrec, gpusync; print('gpusync', gpusync.__version__, '| torch', torch.__version__, '| fbgemm-gpu', fbgemm_gpu.__version__, '| torchrec', torchrec.__version__)"
echo "$WANT" > "$STAMP"
