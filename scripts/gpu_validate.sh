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
# PARTS="costmodel tests ..." runs only those sections (a rerun takes what a first run did not
# bring back); PUBLIC_ROOT=DIR (the public scripts, scripts/public_scripts_fetch.md, copied into
# a git-ignored folder of the checkout and carried) also scans them on real CUDA (about 25 s a
# script there one at a time, on the H200 machine: eight folders at once). The sections took
# 37 s (observer), 130 s (cost model), 20 s (tests), 22 s (bench), 24 s (scans), 11 s
# (overhead), 20 s (sanitizer), 25 s (tune) on that machine (docs/benchmarks/h200-2026-11-27/
# device.txt): with the public scripts, about 6-7 minutes. And run, carrying .whl:
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
# each section bounded, stamped in device.txt: a hung one cannot eat the one lent run
stamp() { echo "$(date -u +%T) +${SECONDS}s $*" >> "$OUT/device.txt"; }
section() { local limit=$1; shift; timeout "$limit" "$@"; local rc=$?; stamp "rc=$rc $*"; }
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
  >> "$OUT/device.txt" 2>&1
nproc >> "$OUT/device.txt"
# PARTS: the sections to run (a rerun takes only those a first run did not bring back)
PARTS=" ${PARTS:-costmodel tests bench scans overhead sanitizer tune public} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
# the C++ op observer built once, before anything is timed (about a minute)
section 180 $PY -c "from gpusync.detect import native; assert native.load() is not None, native.failure()"
if want costmodel; then
  section 300 $PY scripts/costmodel_gpu.py "$RAW" 2>&1 | tee "$OUT/costmodel.md"
  # the per-op figures themselves (host us per op and per backward op, launch, fp32 matmul)
  section 120 $PY scripts/costmodel_calibrate.py 2>&1 | tee -a "$OUT/costmodel.md"
  # packed now: if the run is cut short later, the cost model's JSONs still come back
  tar -czf "$OUT/costmodel-raw.tar.gz" -C "$RAW" . && rm -rf "$RAW" && mkdir -p "$RAW"
fi
# the corpus on real CUDA against its annotations (what the CPU scan must report)
want tests && section 180 $PY -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/tests.txt"
# CUDA's own words for ops handed tensors on both sides of the bus, those gpusync does not judge
# yet included (a convolution's input and weight): what the virtual device is to raise there
want tests && section 60 $PY scripts/device_check_probe.py 2>&1 | tee -a "$OUT/tests.txt"
# the public scripts (PUBLIC_ROOT: the folder scripts/public_scripts_fetch.md builds, carried)
# scanned on real CUDA: the sites against the manifest's, which the CPU scan matches
if want public && [ -d "${PUBLIC_ROOT:-}" ]; then
  section 200 $PY scripts/public_scripts.py --root "$PUBLIC_ROOT" --python "$PY" --timeout 90 --jobs 8 \
    --scan-option=--mode --scan-option=cuda --doc "$OUT/public-cuda.md" > "$RAW/public-cuda.txt" 2>&1
fi
# once: the markdown tables hold what docs/benchmarks/ keeps (device, date, P50, P90, runs)
want bench && section 200 $PY -m gpusync bench all --mode cuda --format markdown > "$OUT/bench-all-cuda.md" 2>&1
if want scans; then
  section 60 $PY -m gpusync scan --mode cuda --format json -o "$RAW/scan-sparsenn-cuda.json"
  section 60 $PY -m gpusync scan --mode simulate --format json -o "$RAW/scan-sparsenn-simulate.json"
fi
want overhead && section 90 $PY -m gpusync bench overhead --mode cuda --steps 40 --format json > "$RAW/overhead-cuda.json"
# the techniques' stream code on real streams, under PyTorch's CUDA stream sanitizer
want sanitizer && TORCH_CUDA_SANITIZER=1 section 120 $PY -m pytest -q -p no:cacheprovider \
  -m "not slow and not torchrec" tests/unit/test_stream_safety.py tests/unit/test_pipeline.py \
  2>&1 | tee -a "$OUT/tests.txt"
if want tune; then
  for profile in writeback sparsenn_pipeline; do
    section 60 $PY -m gpusync tune $profile --mode cuda --allow-approximate --format markdown
  done > "$OUT/tune-cuda.md" 2>&1
fi
tar -czf "$OUT/raw.tar.gz" -C "$OUT" raw && rm -rf "$RAW"
echo "results in $OUT/"
