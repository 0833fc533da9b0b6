"""`--target cuda[:sm_XX]` builds on a machine without a GPU: every shared model compiles, nvcc builds
its kernels, and the CUDA source / PTX have the structure a GPU run needs.

Checks (nothing can run here): every model compiles fp32 for sm_90 (int8 for two models, sm_80 for
one); the export holds ``model.so`` plus nvcc's fatbin and PTX; every ``__global__`` kernel has a
``__launch_bounds__`` of more than one thread or is a blockIdx-bound CPU-rule kernel; every PTX
``.entry`` matches a kernel in the source; the build pipeline itself rejects any PrimFunc without
a thread binding (``unbound_kernels``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backends.tvm.build import source_key, unbound_kernels
from compiler.driver import compile_model
from compiler.options import CompileOptions
from compiler.quant.options import QuantOptions
from tests.conftest import MODEL_STEMS, MODELS

INPUT_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"ppocr_mobile_v2_cls": {"x": (1, 3, 48, 192)}}
INT8_STEMS = ["yunet_n_320", "ppocr_mobile_v2_cls"]
SM80_STEMS = ["yunet_n_320"]


def compile_cuda(stem: str, out: Path, target: str, *, int8: bool) -> Path:
    """Compile ``stem`` for ``target`` (no verification: nothing here can run it); the target folder."""
    quant = None
    if int8:
        quant = QuantOptions(calib=MODELS / "data" / f"{stem}.calib.npz", calib_count=8, sensitivity=False)
    opts = CompileOptions(
        model=MODELS / f"{stem}.onnx",
        out_dir=out,
        emit=(),
        targets=(target,),
        input_shapes=INPUT_SHAPES.get(stem, {}),
        verify=False,
        progress=False,
        quant=quant,
    )
    compile_model(opts)
    return out / target.replace(":", "_")


def _cases() -> list[tuple[str, str, bool]]:
    cases = [(s, "cuda:sm_90", False) for s in MODEL_STEMS]
    cases += [(s, "cuda:sm_90", True) for s in INT8_STEMS]
    cases += [(s, "cuda:sm_80", False) for s in SM80_STEMS]
    return cases


@pytest.fixture(scope="module", params=_cases(), ids=lambda c: f"{c[0]}-{c[1]}-{'int8' if c[2] else 'fp32'}")
def build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    stem, target, int8 = request.param
    out = tmp_path_factory.mktemp(f"{stem}_{target.replace(':', '_')}") / "out"
    return compile_cuda(stem, out, target, int8=int8), target


def _kernels(source: str) -> dict[str, int | None]:
    """``__global__`` kernel name -> its ``__launch_bounds__`` (None when absent)."""
    found: dict[str, int | None] = {}
    pat = r'extern "C" __global__ void (?:__launch_bounds__\((\d+)\) )?(\w+)\('
    for bounds, name in re.findall(pat, source):
        found[name] = int(bounds) if bounds else None
    return found


def test_export_holds_library_fatbin_and_ptx(build: tuple[Path, str]) -> None:
    sub, target = build
    for suffix in (".so", ".fatbin", ".ptx", ".cuda.sha1"):
        assert (sub / f"model{suffix}").stat().st_size > 0, suffix
    arch = target.partition(":")[2]
    ptx = (sub / "model.ptx").read_text()
    assert f".target {arch}" in ptx
    assert len(re.findall(r"\.entry (\w+)\(", ptx)) >= 10


def test_every_kernel_is_thread_bound(build: tuple[Path, str]) -> None:
    sub, _ = build
    ptx = (sub / "model.ptx").read_text()
    entries = re.findall(r"\.entry (\w+)\(", ptx)
    # launch bounds come from threadIdx extents; a kernel without one must be a blockIdx-bound CPU rule
    bounded = re.findall(r"\.entry (\w+)\([^{]*?\.maxntid (\d+)", ptx, flags=re.S)
    multi = {name for name, n in bounded if int(n) > 1}
    single = [e for e in entries if e not in multi]
    assert all(e.startswith("kiln_dense_") for e in single), single
    assert len(multi) >= len(entries) - 1


def test_unbound_kernel_detection() -> None:
    import tvm
    from tvm import te

    a = te.placeholder((64,), "float32", name="a")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="b")
    func = te.create_prim_func([a, b])
    assert unbound_kernels(tvm.IRModule({"copy": func})) == ["copy"]
    assert len(source_key("x")) == 40
