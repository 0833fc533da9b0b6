"""`--target cuda[:sm_XX]` builds on a machine without a GPU: every shared model compiles, nvcc builds
its kernels, and the CUDA source / PTX have the structure a GPU run needs.

Checks (nothing can run here): every model compiles fp32 for sm_90 (int8 for two models, sm_80 for
one); the export holds ``model.so`` plus nvcc's fatbin and PTX; every PTX ``.entry`` has a
``.maxntid`` of more than one thread; the build pipeline itself rejects any PrimFunc without
a thread binding (``unbound_kernels``). Convs: every conv is one of Kiln's CUDA kernels (none left to
the Relax conv2d + dlight fallback), the implicit-GEMM ones stage tiles in ``.shared`` memory and the
int8 models' GEMM convs use ``dp4a``. The kernels' TE math is checked against numpy on the CPU (the
unscheduled compute built for LLVM, ``__dp4a`` emulated); tests/test_tvm_cuda_gpu.py runs the
scheduled kernels on a GPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.tvm.cuda_build import source_key, unbound_kernels
from tests.conftest import MODEL_STEMS
from tests.helpers.shared_compile import compile_shared

ARCHS = ("cuda:sm_80", "cuda:sm_90")


def compile_cuda(stem: str, out: Path, target: str, *, int8: bool) -> Path:
    """Compile ``stem`` for ``target`` (no verification: nothing here can run it); the target folder."""
    compile_shared(stem, out, (target,), int8=int8)
    return out / target.replace(":", "_")


def _cases() -> list[tuple[str, str, bool]]:
    """Every shared model for sm_80 and sm_90, fp32 and int8."""
    return [(s, arch, int8) for s in MODEL_STEMS for arch in ARCHS for int8 in (False, True)]


@pytest.fixture(scope="module", params=_cases(), ids=lambda c: f"{c[0]}-{c[1]}-{'int8' if c[2] else 'fp32'}")
def build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, bool]:
    """(target folder, target, int8) of one compiled case."""
    stem, target, int8 = request.param
    out = tmp_path_factory.mktemp(f"{stem}_{target.replace(':', '_')}") / "out"
    return compile_cuda(stem, out, target, int8=int8), target, int8


def _entries(ptx: str) -> dict[str, str]:
    """PTX ``.entry`` name -> its text (up to the next entry)."""
    parts = re.split(r"(?=\.visible \.entry )", ptx)
    return {m.group(1): p for p in parts if (m := re.search(r"\.entry (\w+)\(", p))}


def test_export_holds_library_fatbin_and_ptx(build: tuple[Path, str, bool]) -> None:
    sub, target, _ = build
    for suffix in (".so", ".fatbin", ".ptx", ".cuda.sha1"):
        assert (sub / f"model{suffix}").stat().st_size > 0, suffix
    arch = target.partition(":")[2]
    ptx = (sub / "model.ptx").read_text()
    assert f".target {arch}" in ptx
    assert len(re.findall(r"\.entry (\w+)\(", ptx)) >= 10


@pytest.mark.parametrize("build", [("yunet_n_320", "cuda:sm_90", False)], indirect=True, ids=["yunet"])
def test_loading_without_a_gpu_names_the_file_and_why(build: tuple[Path, str, bool]) -> None:
    """This machine has no GPU: Kiln's runtime refuses with one ModelFileError (the CLI's exit 2)."""
    from backends.tvm.runtime import load_artifact
    from compiler.errors import ModelFileError

    with pytest.raises(ModelFileError, match=r"model\.so: a CUDA library, and this machine has no CUDA GPU"):
        load_artifact(build[0] / "model.so")


def test_every_kernel_is_thread_bound(build: tuple[Path, str, bool]) -> None:
    sub, _, _ = build
    ptx = (sub / "model.ptx").read_text()
    entries = re.findall(r"\.entry (\w+)\(", ptx)
    # launch bounds come from threadIdx extents: every kernel runs more than one thread per block
    bounded = re.findall(r"\.entry (\w+)\([^{]*?\.maxntid (\d+)", ptx, flags=re.S)
    multi = {name for name, n in bounded if int(n) > 1}
    single = [e for e in entries if e not in multi]
    assert not single, single


def test_convs_are_kiln_cuda_kernels_with_shared_tiles(build: tuple[Path, str, bool]) -> None:
    sub, _, int8 = build
    entries = _entries((sub / "model.ptx").read_text())
    fallback = [e for e in entries if "conv" in e and not e.startswith("kiln_cuda_")]
    assert not fallback, fallback  # no conv left to Relax conv2d + dlight Fallback
    gemm = [e for e in entries if e.startswith(("kiln_cuda_conv2d_gemm", "kiln_cuda_qconv2d_dp4a"))]
    assert len(gemm) >= 8
    for name in gemm:
        body = entries[name]
        assert re.search(r"\.shared \.align \d+ \.b8 \w+\[\d+\]", body), name
        assert "bar.sync" in body and "ld.shared" in body, name
    if int8:
        dp4a = [e for e in gemm if e.startswith("kiln_cuda_qconv2d_dp4a")]
        assert len(dp4a) >= 8
        for name in dp4a:
            assert len(re.findall(r"\bdp4a\.s32\.s32\b", entries[name])) >= 8, name


def test_unbound_kernel_detection() -> None:
    import tvm
    from tvm import te

    a = te.placeholder((64,), "float32", name="a")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="b")
    func = te.create_prim_func([a, b])
    assert unbound_kernels(tvm.IRModule({"copy": func})) == ["copy"]
    assert len(source_key("x")) == 40


# --- the CUDA conv kernels' math, on the CPU (the unscheduled TE compute built for LLVM) ---

FP32_SPECS: dict[str, dict[str, Any]] = {
    "gemm3x3_res_leaky": dict(
        in_channels=5,
        in_h=7,
        in_w=9,
        out_channels=6,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        activation="leaky_relu",
        alpha=0.1,
        residual=True,
    ),
    "gemm1x1_s2_b2": dict(
        batch=2, in_channels=8, in_h=6, in_w=5, out_channels=33, kernel=(1, 1), strides=(2, 2)
    ),
    "gemm3x2_dil_pad": dict(
        in_channels=3,
        in_h=9,
        in_w=8,
        out_channels=4,
        kernel=(3, 2),
        dilations=(2, 1),
        pads=(2, 0, 1, 1),
        activation="hard_swish",
    ),
    "dw3x3_s2_relu6": dict(
        in_channels=6,
        in_h=9,
        in_w=7,
        out_channels=6,
        kernel=(3, 3),
        strides=(2, 2),
        pads=(1, 1, 1, 1),
        groups=6,
        activation="relu6",
        residual=True,
    ),
}
INT8_SPECS: dict[str, dict[str, Any]] = {
    "dp4a3x3_res_hswish": dict(
        in_channels=6,
        in_h=7,
        in_w=9,
        out_channels=5,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        x_zero=3,
        y_scale=0.05,
        y_zero=7,
        activation="hard_swish",
        residual=True,
        r_scale=0.04,
        r_zero=100,
    ),
    "dp4a1x1_s2_int8out": dict(
        batch=2,
        in_channels=8,
        in_h=6,
        in_w=5,
        out_channels=7,
        kernel=(1, 1),
        strides=(2, 2),
        x_zero=128,
        out_dtype="int8",
        y_scale=0.3,
        activation="relu",
    ),
    "dp4a3x3_hsig_int8res": dict(
        in_channels=9,
        in_h=5,
        in_w=6,
        out_channels=3,
        kernel=(3, 3),
        pads=(0, 1, 2, 1),
        x_zero=255,
        y_scale=0.002,
        activation="hard_sigmoid",
        alpha=0.2,
        beta=0.5,
        residual=True,
        r_dtype="int8",
        r_scale=0.01,
        r_zero=-3,
    ),
    "dw3x3_float_out": dict(
        in_channels=4,
        in_h=6,
        in_w=6,
        out_channels=4,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        groups=4,
        x_zero=17,
        out_dtype="float32",
    ),
    "dw3x3_relu6": dict(
        in_channels=8,
        in_h=6,
        in_w=7,
        out_channels=8,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        groups=8,
        x_zero=100,
        y_scale=0.03,
        y_zero=5,
        activation="relu6",
    ),
    "dp4a3x3_clip": dict(
        in_channels=12,
        in_h=5,
        in_w=5,
        out_channels=6,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        x_zero=60,
        y_scale=0.04,
        y_zero=120,
        activation="clip",
        alpha=-2.5,
        beta=3.0,
    ),
}


def _run_llvm(args: list[Any], inputs: list[np.ndarray]) -> np.ndarray:
    import tvm
    from tvm import te

    from backends.tvm.target import resolve_target

    lib = tvm.compile(
        tvm.IRModule({"main": te.create_prim_func(args)}), target=resolve_target("cpu").tvm_target()
    )
    dev = tvm.cpu(0)
    out = args[-1]
    y = tvm.runtime.tensor(np.zeros([int(v) for v in out.shape], str(out.dtype)), dev)
    lib["main"](*[tvm.runtime.tensor(v, dev) for v in inputs], y)
    return y.numpy()


def fp32_case(name: str, seed: int = 0) -> tuple[Any, list[np.ndarray], np.ndarray]:
    """(Conv2dSpec, NCHW inputs with packed weights, numpy reference) for one of ``FP32_SPECS``."""
    from backends.tvm.kernels.conv_spec import Conv2dSpec
    from backends.tvm.kernels.cuda_conv2d import pack_cuda_weight
    from tests.test_tvm_conv_kernels import _reference

    spec = Conv2dSpec(**{"batch": 1, "in_block": 0, "out_block": 0, **FP32_SPECS[name]})
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.batch, spec.in_channels, spec.in_h, spec.in_w)).astype(np.float32)
    w = rng.standard_normal((spec.out_channels, spec.in_channels // spec.groups, *spec.kernel)).astype(
        np.float32
    )
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    out_shape = (spec.batch, spec.out_channels, spec.out_h, spec.out_w)
    r = rng.standard_normal(out_shape).astype(np.float32) if spec.residual else None
    inputs = [x, pack_cuda_weight(w, spec), b, *([r] if r is not None else [])]
    return spec, inputs, _reference(spec, x, w, b, r)


def int8_case(name: str, seed: int = 0) -> tuple[Any, list[np.ndarray], np.ndarray]:
    """(QConv2dSpec, NCHW inputs with packed constants, numpy reference) for one of ``INT8_SPECS``."""
    from backends.tvm.kernels.cuda_qconv2d import pack_cuda_multiplier, pack_cuda_qbias, pack_cuda_qweight
    from backends.tvm.kernels.qconv_spec import QConv2dSpec
    from tests.helpers.int8_conv_reference import reference

    spec = QConv2dSpec(**{"batch": 1, "in_block": 4, "out_block": 4, **INT8_SPECS[name]})
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (spec.batch, spec.in_channels, spec.in_h, spec.in_w)).astype(np.uint8)
    w = rng.integers(-128, 128, (spec.out_channels, spec.in_channels // spec.groups, *spec.kernel)).astype(
        np.int8
    )
    b = rng.integers(-5000, 5000, spec.out_channels).astype(np.int32)
    x_scale, w_scale = 0.02, rng.uniform(0.001, 0.01, spec.out_channels).astype(np.float32)
    out_shape = (spec.batch, spec.out_channels, spec.out_h, spec.out_w)
    r = rng.integers(-128, 128, out_shape) if spec.residual else None
    if r is not None:
        r = (r + (128 if spec.r_dtype == "uint8" else 0)).astype(spec.r_dtype)
    inputs = [
        x,
        pack_cuda_qweight(w, spec),
        pack_cuda_qbias(b, w, spec),
        pack_cuda_multiplier(x_scale, w_scale, spec),
        *([r] if r is not None else []),
    ]
    return spec, inputs, reference(x, w, b, x_scale, w_scale, spec, r)


@pytest.mark.parametrize("name", list(FP32_SPECS))
def test_cuda_conv2d_compute_matches_numpy(name: str) -> None:
    from backends.tvm.kernels.cuda_conv2d import cuda_conv2d_compute

    spec, inputs, ref = fp32_case(name)
    got = _run_llvm(cuda_conv2d_compute(spec), inputs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(INT8_SPECS))
def test_cuda_qconv2d_compute_matches_numpy_exactly(name: str) -> None:
    from backends.tvm.kernels.cuda_qconv2d import cuda_qconv2d_compute

    spec, inputs, ref = int8_case(name)
    got = _run_llvm(cuda_qconv2d_compute(spec, gpu=False), inputs)
    assert got.dtype == ref.dtype
    if spec.out_dtype == "float32":
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)
        assert len(np.unique(got)) > 5  # not saturated


def test_qweight_words_and_shifted_bias() -> None:
    """Word ``[k4, oc]`` holds channels ``4*c4 .. 4*c4+3`` little endian; the bias absorbs the -128 shift."""
    from backends.tvm.kernels.cuda_qconv2d import pack_cuda_qbias, pack_cuda_qweight
    from backends.tvm.kernels.qconv_spec import QConv2dSpec

    spec = QConv2dSpec(1, 6, 4, 4, 2, (1, 2), in_block=4, out_block=4, x_zero=10)
    w = np.arange(24, dtype=np.int8).reshape(2, 6, 1, 2) - 12
    words = pack_cuda_qweight(w, spec)
    assert words.shape == (8, 2) and words.dtype == np.int32  # K4 = 2 chunks x 2 taps, padded to 8
    as_bytes = words.view(np.int8).reshape(8, 2, 4)
    np.testing.assert_array_equal(as_bytes[1, 1], w[1, 0:4, 0, 1])  # k4 = (c4=0, kw=1)
    np.testing.assert_array_equal(as_bytes[3, 0], [w[0, 4, 0, 1], w[0, 5, 0, 1], 0, 0])
    assert not as_bytes[4:].any()
    bias = pack_cuda_qbias(np.array([5, -5], np.int32), w, spec)
    np.testing.assert_array_equal(bias, np.array([5, -5]) + (128 - 10) * w.reshape(2, -1).sum(1).astype(int))


def test_kernels_compile_to_dp4a_and_shared_ptx() -> None:
    """The scheduled kernels of all specs above, one nvcc build: dp4a in the int8 GEMMs, shared tiles."""
    import tvm

    from backends.tvm.cuda_build import compile_cuda_source
    from backends.tvm.kernels.cuda_conv2d import cuda_conv2d_kernel
    from backends.tvm.kernels.cuda_qconv2d import cuda_qconv2d_kernel
    from backends.tvm.target import resolve_target

    target = resolve_target("cuda:sm_80")
    kernels = [cuda_conv2d_kernel(fp32_case(n)[0], target) for n in FP32_SPECS]
    kernels += [cuda_qconv2d_kernel(int8_case(n)[0], target) for n in INT8_SPECS]
    mod = tvm.IRModule({k.name: k.func for k in kernels})
    lib = tvm.compile(mod, target=target.tvm_target())
    ptx = compile_cuda_source(lib.mod.imports[0].inspect_source("cuda"), "sm_80")[1]
    entries = _entries(ptx)
    assert sorted(entries) == sorted(f"{k.name}_kernel" for k in kernels)
    for name, body in entries.items():
        gemm = "_gemm" in name or "_dp4a" in name
        assert (".shared" in body) == gemm, name
        assert (len(re.findall(r"\bdp4a\.s32\.s32\b", body)) >= 8) == ("_dp4a" in name), name
        assert int(re.findall(r"\.maxntid (\d+)", body)[0]) >= 32, name
    linear = {
        k.name
        for n in INT8_SPECS
        if (spec := int8_case(n)[0]).linear_requant
        for k in [cuda_qconv2d_kernel(spec, target)]
    }
    assert len(linear) == 3
    for name, body in entries.items():
        # the linear requantize: one float64 product rounded on its own, never an FMA
        assert ("mul.rn.f64" in body) == (name[: -len("_kernel")] in linear), name
        assert "fma.rn.f64" not in body, name
