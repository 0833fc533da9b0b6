"""`--target cuda` artifacts run on a real GPU (tvm.cuda(0)) against onnxruntime on the CPU.

Marked ``gpu``: deselected by default (pyproject addopts ``-m 'not gpu'``); scripts/gpu_check.sh runs it.
fp32 max rel 1e-3 against the ONNX model on the real inputs. Kiln's CUDA conv kernels (scheduled:
implicit GEMM with shared tiles, ``__dp4a``, depthwise) run alone against numpy: fp32 within 1e-4,
int8 exactly (the epilogue's products are ``__fmul_rn``, never contracted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.tvm.cuda_build import register_prebuilt_cuda
from compiler.runners import run_onnxruntime
from tests.conftest import MODELS
from tests.test_tvm_cuda import FP32_SPECS, INT8_SPECS, compile_cuda, fp32_case, int8_case

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


def _run_kernel(kernel: Any, inputs: list[np.ndarray]) -> np.ndarray:
    """Build one scheduled kernel for this GPU's arch (nvcc via Kiln's build) and run it on tvm.cuda(0)."""
    import tvm
    import tvm_ffi

    from backends.tvm.cuda_build import compile_cuda_source
    from backends.tvm.target import resolve_target

    dev = tvm.cuda(0)
    assert dev.exist
    arch = "sm_" + str(dev.compute_version).replace(".", "")

    def _compile(code: Any, *_rest: Any) -> bytes:
        return compile_cuda_source(str(code), arch)[0]

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile, override=True)
    target = resolve_target(f"cuda:{arch}")
    lib = tvm.compile(tvm.IRModule({kernel.name: kernel.func}), target=target.tvm_target())
    out = tvm.runtime.tensor(np.zeros(kernel.out_shape, kernel.out_dtype), dev)
    lib[kernel.name](*[tvm.runtime.tensor(v, dev) for v in inputs], out)
    return out.numpy()


@pytest.mark.parametrize("name", list(FP32_SPECS))
def test_cuda_conv2d_kernel_on_gpu(name: str) -> None:
    from backends.tvm.kernels.cuda_conv2d import cuda_conv2d_kernel
    from backends.tvm.target import resolve_target

    spec, inputs, ref = fp32_case(name)
    got = _run_kernel(cuda_conv2d_kernel(spec, resolve_target("cuda")), inputs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(INT8_SPECS))
def test_cuda_qconv2d_kernel_on_gpu(name: str) -> None:
    from backends.tvm.kernels.cuda_qconv2d import cuda_qconv2d_kernel
    from backends.tvm.target import resolve_target

    spec, inputs, ref = int8_case(name)
    got = _run_kernel(cuda_qconv2d_kernel(spec, resolve_target("cuda")), inputs)
    if spec.out_dtype == "float32":
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)
