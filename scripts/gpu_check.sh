#!/usr/bin/env bash
# GPU check, offline, from the repo root. Exits non-zero on any failure.
#
#   scripts/gpu_check.sh        every shared model built with --target cuda (fp32 and int8) here, run on
#                               the GPU, compared with onnxruntime and timed (scripts/gpu_check.py), then
#                               `pytest -m gpu`. Needs .venv with TVM's compiler, nvcc and a GPU.
#   scripts/gpu_check.sh DIR    run cases prebuilt by `scripts/gpu_check.py build DIR` on a machine with
#                               TVM's compiler: here only TVM's runtime, numpy (and onnxruntime for the
#                               CPU column) are needed, as on a deployment machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
if [ $# -ge 1 ]; then
  exec "$PY" scripts/gpu_check.py run "$1" --json "$1/results.json"
fi
"$PY" -c "import tvm, onnxruntime; assert tvm.cuda(0).exist, 'TVM sees no CUDA device'" \
  || { echo "gpu_check: TVM cannot see a CUDA device" >&2; exit 2; }
status=0
"$PY" scripts/gpu_check.py || status=1
"$PY" -m pytest -q -m gpu tests/test_tvm_cuda_gpu.py || status=1
exit $status
