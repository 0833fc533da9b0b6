#!/usr/bin/env bash
# Run on a machine with an NVIDIA GPU, from the repo root, offline: every shared model built with
# --target cuda (fp32 and int8), run with the TVM runtime on the GPU, compared with onnxruntime on
# the CPU and timed (scripts/gpu_check.py), then `pytest -m gpu`. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  echo "gpu_check: no .venv here; creating one offline from the repo's own files" >&2
  python3 -m venv .venv
  if ! .venv/bin/pip install --no-index --no-build-isolation -e . >/dev/null 2>&1; then
    echo "gpu_check: cannot build .venv offline: apache-tvm 0.27, onnx, onnxruntime, numpy and pytest" >&2
    echo "           must be installed (carry the repo's .venv, or a wheel folder and use pip --find-links)" >&2
    exit 2
  fi
  PY=.venv/bin/python
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
"$PY" -c "import tvm, onnxruntime; assert tvm.cuda(0).exist, 'TVM sees no CUDA device'" \
  || { echo "gpu_check: TVM cannot see a CUDA device" >&2; exit 2; }
status=0
"$PY" scripts/gpu_check.py "$@" || status=1
"$PY" -m pytest -q -m gpu tests/test_tvm_cuda_gpu.py || status=1
exit $status
