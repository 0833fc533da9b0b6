"""`--target cuda` artifacts run on a real GPU (tvm.cuda(0)) against onnxruntime on the CPU.

Marked ``gpu``: deselected by default (pyproject addopts ``-m 'not gpu'``); scripts/gpu_check.sh runs it.
fp32 max rel 1e-3 against the ONNX model on the real inputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.tvm.build import register_prebuilt_cuda
from compiler.runners import run_onnxruntime
from tests.conftest import MODELS
from tests.test_tvm_cuda import compile_cuda

pytestmark = pytest.mark.gpu
FP32_MAX_REL = 1e-3


@pytest.mark.parametrize("stem", ["yunet_n_320", "ultraface_rfb320"])
def test_cuda_fp32_matches_onnxruntime(stem: str, tmp_path: Path) -> None:
    import tvm
    from tvm import relax

    sub = compile_cuda(stem, tmp_path / "out", "cuda", int8=False)
    lib = sub / "model.so"
    register_prebuilt_cuda(lib)
    dev = tvm.cuda(0)
    assert dev.exist
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    feeds = {k: np.asarray(v) for k, v in np.load(MODELS / "data" / f"{stem}.npz").items()}
    res = vm["main"](*[tvm.runtime.tensor(v, dev) for v in feeds.values()])
    got = [r.numpy() for r in res] if hasattr(res, "__len__") else [res.numpy()]
    ref = run_onnxruntime(MODELS / f"{stem}.onnx", feeds)
    ref_list = list(ref.values()) if isinstance(ref, dict) else list(ref)
    assert len(got) == len(ref_list)
    for g, r in zip(got, ref_list, strict=True):
        r = np.asarray(r, np.float64)
        rel = np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-12)
        assert rel <= FP32_MAX_REL, rel
