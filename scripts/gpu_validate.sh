#!/usr/bin/env bash
# GPU validation (developer tool, not imported by the package): run on a machine with CUDA.
# First the cost model against the GPU (scripts/costmodel_gpu.py: measured vs predicted step and
# stall per site, and the machine's host file), then the GPU-marked tests, the CPU-vs-CUDA
# comparison of the built-in example, the scanner's overhead in cuda mode, every technique with
# --mode cuda and tune (last: the least needed if the run is cut short). The lent GPU machines
# have torch but not torchrec / fbgemm-gpu: those parts report "not run". Seven files in $OUT
# (the device tool brings back eight at most): the readable results, the cost model's JSONs in
# costmodel-raw.tar.gz, the others in raw.tar.gz.
#
# The lent machines lack jsonschema, which the test suite imports: carry it as wheels, made
# here once (.whl/ is git-ignored through .git/info/exclude):
#   for p in jsonschema==4.26.0 attrs==26.1.0 referencing==0.37.0 rpds-py==2026.9.1 \
#            jsonschema-specifications==2025.9.1; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl $p; done
# and run, carrying .whl:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \
#     PYTHON=python3 bash scripts/gpu_validate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
RAW="$OUT/raw"
mkdir -p "$RAW"
PY=${PYTHON:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$OUT/device.txt" 2>&1
$PY scripts/costmodel_gpu.py "$RAW" 2>&1 | tee "$OUT/costmodel.md"
# packed now: if the run is cut short later, the cost model's JSONs still come back
tar -czf "$OUT/costmodel-raw.tar.gz" -C "$RAW" . && rm -rf "$RAW" && mkdir -p "$RAW"
$PY -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/tests.txt"
# the techniques' stream code on real streams, under PyTorch's CUDA stream sanitizer
TORCH_CUDA_SANITIZER=1 $PY -m pytest -q -p no:cacheprovider -m "not slow and not torchrec" \
  tests/unit/test_stream_safety.py tests/unit/test_pipeline.py 2>&1 | tee -a "$OUT/tests.txt"
$PY -m gpusync scan --mode cuda --format json -o "$RAW/scan-sparsenn-cuda.json"
$PY -m gpusync scan --mode simulate --format json -o "$RAW/scan-sparsenn-simulate.json"
$PY -m gpusync bench overhead --mode cuda --steps 40 --format json > "$RAW/overhead-cuda.json"
# once: the markdown tables hold what docs/benchmarks/ keeps (device, date, P50, P90, runs)
$PY -m gpusync bench all --mode cuda --format markdown > "$OUT/bench-all-cuda.md" 2>&1
for profile in writeback sparsenn_pipeline; do
  $PY -m gpusync tune $profile --mode cuda --allow-approximate --format markdown
done > "$OUT/tune-cuda.md" 2>&1
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$RAW"
echo "results in $OUT/"
