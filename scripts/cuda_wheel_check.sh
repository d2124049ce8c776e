#!/usr/bin/env bash
# The test suite with PyPI's CUDA wheel of torch on a machine without a GPU: what a CI machine
# that ran `pip install torch` has, where the virtual device must answer as on CI's CPU wheel
# (docs/guarantees.md, "The virtual device answers as a CUDA build"). A developer tool, not run
# by CI (CI never installs a CUDA build): it downloads about 3 GB into VENV.
#   bash scripts/cuda_wheel_check.sh [VENV] [TORCH_VERSION] [PYTEST ARGS...]
# The machine's pip configuration is set aside (this project's machines point pip at a folder
# of CPU wheels); the index is pip's default one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${TMPDIR:-/tmp}/gpusync-cuda-wheel}
TORCH=${2:-2.13.0}
shift $(( $# < 2 ? $# : 2 ))
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# the pinned test and runtime requirements, less CI's CPU-only torch stack
grep -vE '^(torch|fbgemm|tensordict|torchmetrics|lightning|pyre|typing-inspect|ruff|mypy|types-)' \
  requirements/pinned.txt | grep -vE '^\s*(#|$)' > "$VENV/requirements.txt"
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
  "$VENV/bin/python" -m pip install -q "torch==$TORCH" -r "$VENV/requirements.txt"
"$VENV/bin/python" -c "import torch; assert torch.version.cuda, 'not a CUDA build'; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available())"
PYTHONPATH=$PWD exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n auto \
  -m "not torchrec" "$@"
