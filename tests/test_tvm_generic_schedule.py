"""The generic CPU schedule pass: numerics against numpy and the loop kinds it produces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as stock

from backends.tvm.schedule_generic import KilnGenericSchedule, schedule_unscheduled
from backends.tvm.target import TargetSpec, resolve_target
from compiler.ops.pooling import AveragePoolAttrs, MaxPoolAttrs
from compiler.ops.registry import get_op

SPECS = [resolve_target("cpu"), resolve_target("x86-avx2")]


def _legalize(target: Any) -> list[Any]:
    return list(stock.legalize_passes(target))


def _pipeline(spec: TargetSpec) -> Any:
    tgt = spec.tvm_target()

    @tvm.transform.module_pass(opt_level=0, name="KilnTestPipeline")
    def _p(mod: Any, _ctx: Any) -> Any:
        with tgt:
            passes = (
                _legalize(tgt)
                + [KilnGenericSchedule(spec)]
                + list(stock.dataflow_lower_passes(tgt))
                + list(stock.finalize_passes(tgt))
            )
            return tvm.transform.Sequential(passes)(mod)

    return _p


def _build(shapes: Sequence[tuple[int, ...]], body: Callable[..., Any]) -> Any:
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return bb.get()


def _run(spec: TargetSpec, mod: Any, inputs: Sequence[np.ndarray]) -> np.ndarray:
    ex = tvm.compile(mod, spec.tvm_target(), relax_pipeline=_pipeline(spec))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _scheduled(spec: TargetSpec, mod: Any) -> list[Any]:
    with spec.tvm_target() as tgt:
        mod = tvm.transform.Sequential(_legalize(tgt))(mod)
    out = schedule_unscheduled(mod, spec)
    return [f for _, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_large_elementwise_is_parallel_and_vectorized(spec: TargetSpec) -> None:
    a, b = _rand(1, 32, 40, 48), _rand(1, 32, 1, 48, seed=1)
    mod = _build([a.shape, b.shape], lambda x, y: relax.op.sigmoid(relax.op.add(x, y)))
    funcs = _scheduled(spec, mod)
    assert len(funcs) == 1
    text = funcs[0].script()
    assert "T.parallel" in text and "T.vectorized" in text
    assert funcs[0].attrs["kiln.scheduled"] == "generic"
    _close(_run(spec, mod, [a, b]), 1 / (1 + np.exp(-(a + b))))


def test_small_elementwise_stays_serial() -> None:
    spec = SPECS[0]
    a = _rand(4, 32)
    mod = _build([a.shape], lambda x: relax.op.multiply(x, relax.const(2.0, "float32")))
    text = _scheduled(spec, mod)[0].script()
    assert "T.parallel" not in text and "T.vectorized" in text
    _close(_run(spec, mod, [a]), a * 2)


def test_concat_and_permute() -> None:
    spec = SPECS[0]
    a, b = _rand(1, 16, 20, 24), _rand(1, 8, 20, 24, seed=1)
    mod = _build(
        [a.shape, b.shape], lambda x, y: relax.op.permute_dims(relax.op.concat([x, y], axis=1), [0, 2, 3, 1])
    )
    _close(_run(spec, mod, [a, b]), np.concatenate([a, b], 1).transpose(0, 2, 3, 1))


def _resize_ref(x: np.ndarray, oh: int, ow: int, method: str, blocked: bool) -> np.ndarray:
    """Nearest = asymmetric + floor; linear = half_pixel; x is NCHW or NCHW[b]c."""
    h, w = (x.shape[2], x.shape[3])
    ys, xs = np.arange(oh, dtype=np.float64), np.arange(ow, dtype=np.float64)
    if method == "nearest_neighbor":
        iy = np.minimum(np.floor(ys * h / oh), h - 1).astype(int)
        ix = np.minimum(np.floor(xs * w / ow), w - 1).astype(int)
        return x[:, :, iy][:, :, :, ix]
    sy, sx = (ys + 0.5) * h / oh - 0.5, (xs + 0.5) * w / ow - 0.5
    fy, fx = np.floor(sy), np.floor(sx)
    y0, y1 = np.clip(fy, 0, h - 1).astype(int), np.clip(fy + 1, 0, h - 1).astype(int)
    x0, x1 = np.clip(fx, 0, w - 1).astype(int), np.clip(fx + 1, 0, w - 1).astype(int)
    wy, wx = (sy - fy), (sx - fx)
    if blocked:
        wy, wx = wy[:, None, None], wx[None, :, None]
    else:
        wy, wx = wy[:, None], wx[None, :]
    xd = x.astype(np.float64)

    def at(iy: np.ndarray, ix: np.ndarray) -> np.ndarray:
        return xd[:, :, iy][:, :, :, ix]

    top = at(y0, x0) * (1 - wx) + at(y0, x1) * wx
    bot = at(y1, x0) * (1 - wx) + at(y1, x1) * wx
    return (top * (1 - wy) + bot * wy).astype(np.float32)


@pytest.mark.parametrize("method", ["nearest_neighbor", "linear"])
@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "nchw16c"])
def test_resize2d(method: str, blocked: bool) -> None:
    spec = SPECS[0]
    x = _rand(1, 2, 9, 11, 16) if blocked else _rand(1, 8, 9, 11)
    kw: dict[str, Any] = {"layout": "NCHW16c" if blocked else "NCHW", "method": method}
    if method == "nearest_neighbor":
        kw.update(coordinate_transformation_mode="asymmetric", rounding_method="floor")
    mod = _build([x.shape], lambda v: relax.op.image.resize2d(v, (18, 22), **kw))
    _close(_run(spec, mod, [x]), _resize_ref(x, 18, 22, method, blocked))


def test_softmax_and_mean() -> None:
    spec = SPECS[0]
    x = _rand(3, 50, 40)
    mod = _build(
        [x.shape],
        lambda v: relax.op.add(relax.op.nn.softmax(v, axis=-1), relax.op.mean(v, axis=[1, 2], keepdims=True)),
    )
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True) + x.mean(axis=(1, 2), keepdims=True)
    _close(_run(spec, mod, [x]), ref)


def test_sum_over_channels_vectorizes_inner_axis() -> None:
    spec = SPECS[0]
    x = _rand(2, 24, 20, 32)
    mod = _build([x.shape], lambda v: relax.op.sum(v, axis=[1]))
    text = _scheduled(spec, mod)[0].script()
    assert "T.vectorized" in text and "T.parallel" in text
    _close(_run(spec, mod, [x]), x.sum(1))


@pytest.mark.parametrize("ceil", [False, True])
def test_max_pool2d(ceil: bool) -> None:
    spec = SPECS[0]
    x = _rand(1, 16, 29, 30)
    mod = _build([x.shape], lambda v: relax.op.nn.max_pool2d(v, (3, 3), (2, 2), (1, 1, 0, 1), ceil_mode=ceil))
    attrs = MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 0, 1), ceil_mode=int(ceil))
    ref = get_op("MaxPool").reference([x], attrs, 1)[0]
    _close(_run(spec, mod, [x]), ref)


@pytest.mark.parametrize("include_pad", [False, True])
def test_avg_pool2d(include_pad: bool) -> None:
    spec = SPECS[0]
    x = _rand(1, 16, 28, 28)
    mod = _build(
        [x.shape],
        lambda v: relax.op.nn.avg_pool2d(v, (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=include_pad),
    )
    attrs = AveragePoolAttrs(
        kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), count_include_pad=int(include_pad)
    )
    ref = get_op("AveragePool").reference([x], attrs, 1)[0]
    _close(_run(spec, mod, [x]), ref)


def test_max_pool3d_on_blocked_tensor() -> None:
    """NCHW16c max pool written as a 3-D pool with a unit window on the block axis."""
    spec = SPECS[0]
    x = _rand(1, 2, 14, 14, 16)
    mod = _build([x.shape], lambda v: relax.op.nn.max_pool3d(v, (3, 3, 1), (2, 2, 1), (1, 1, 0, 1, 1, 0)))
    text = _scheduled(spec, mod)[0].script()
    assert "T.vectorized" in text
    nchw = x.transpose(0, 1, 4, 2, 3).reshape(1, 32, 14, 14)
    ref = get_op("MaxPool").reference(
        [nchw], MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), 1
    )[0]
    ref = ref.reshape(1, 2, 16, 7, 7).transpose(0, 1, 3, 4, 2)
    _close(_run(spec, mod, [x]), ref)


def test_matmul_fallback_is_tiled() -> None:
    spec = SPECS[0]
    a, w = _rand(24, 40), _rand(64, 40, seed=1)
    mod = _build([a.shape, w.shape], lambda x, y: relax.op.matmul(x, relax.op.permute_dims(y, [1, 0])))
    texts = [f.script() for f in _scheduled(spec, mod)]
    assert any("T.unroll" in t and "T.vectorized" in t and '"local"' not in t for t in texts)
    _close(_run(spec, mod, [a, w]), a @ w.T)


def test_grouped_conv2d_fallback() -> None:
    spec = SPECS[0]
    x, w = _rand(1, 8, 12, 16), _rand(6, 4, 3, 3, seed=1)
    mod = _build([x.shape, w.shape], lambda v, k: relax.op.nn.conv2d(v, k, padding=(1, 1), groups=2))
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 6, 12, 16))
    for g in range(2):
        for kh in range(3):
            for kw in range(3):
                win = xp[:, g * 4 : (g + 1) * 4, kh : kh + 12, kw : kw + 16]
                ref[:, g * 3 : (g + 1) * 3] += np.einsum(
                    "nchw,oc->nohw", win, w[g * 3 : (g + 1) * 3, :, kh, kw]
                )
    _close(_run(spec, mod, [x, w]), ref.astype(np.float32))


def test_symbolic_shapes_and_marked_funcs_survive() -> None:
    spec = SPECS[0]
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(x, x)))
        bb.emit_func_output(out)
    mod = bb.get()
    funcs = _scheduled(spec, mod)
    assert all(f.attrs["kiln.scheduled"] == "generic" for f in funcs)
    a = _rand(5, 64)
    _close(_run(spec, mod, [a]), np.maximum(a + a, 0))
    # A function already marked by a Kiln kernel rule is left exactly as it is.
    marked = funcs[0].with_attr("kiln.scheduled", "dense")
    again = schedule_unscheduled(tvm.IRModule({"k": marked}), spec)
    assert again["k"].same_as(marked)


def test_transpose_is_tiled() -> None:
    spec = SPECS[0]
    a = _rand(256, 72)
    mod = _build([a.shape], lambda x: relax.op.permute_dims(x, [1, 0]))
    text = _scheduled(spec, mod)[0].script()
    assert "T.grid(T.int64(8), T.int64(8))" in text and "T.parallel" in text
    _close(_run(spec, mod, [a]), a.T)


_Case = tuple[Any, list[str], Callable[[np.ndarray, np.ndarray], list[np.ndarray]]]


def _split_after_unpack(branches: int) -> _Case:
    """What FuseOps/FuseTIR make of ``split(unpack(a + b))`` on an NCHW16c tensor: the unpacked
    buffer is read by one block per split branch. The PrimFunc, the reader blocks, numpy's result."""
    from tvm import te

    a = te.placeholder((1, 1, 8, 8, 16), name="a")
    b = te.placeholder((1, 1, 8, 8, 16), name="b")
    add = te.compute(a.shape, lambda n, c, h, w, i: a[n, c, h, w, i] + b[n, c, h, w, i], name="T_add")
    unpack = te.compute((1, 16, 8, 8), lambda n, c, h, w: add[n, c // 16, h, w, c % 16], name="unpack")
    width = 16 // branches
    names = ["T_split"] + [f"T_split_{k}" for k in range(1, branches)]

    def branch(k: int) -> Any:
        return te.compute((1, width, 8, 8), lambda n, c, h, w: unpack[n, c + k * width, h, w], name=names[k])

    outs = [branch(k) for k in range(branches)]

    def ref(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        nchw = (x + y).transpose(0, 1, 4, 2, 3).reshape(1, 16, 8, 8)
        return [nchw[:, k * width : (k + 1) * width] for k in range(branches)]

    return te.create_prim_func([a, b, *outs]), names, ref


def _concat_read_twice() -> _Case:
    """``concat([a, b])`` read by a copy of its first half and by a sigmoid of all of it (a
    detection head's box / score branches after fusion)."""
    from tvm import te, tirx

    a = te.placeholder((1, 4, 8, 8), name="a")
    b = te.placeholder((1, 4, 8, 8), name="b")
    cat = te.compute(
        (1, 8, 8, 8),
        lambda n, c, h, w: tirx.if_then_else(c < 4, a[n, c, h, w], b[n, te.max(c - 4, 0), h, w]),
        name="T_concat",
    )
    box = te.compute((1, 4, 8, 8), lambda n, c, h, w: cat[n, c, h, w], name="T_box")
    score = te.compute((1, 8, 8, 8), lambda n, c, h, w: te.sigmoid(cat[n, c, h, w]), name="T_score")

    def ref(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        return [x, 1 / (1 + np.exp(-np.concatenate([x, y], 1)))]

    return te.create_prim_func([a, b, box, score]), ["T_box", "T_score"], ref


def _run_primfunc(spec: TargetSpec, func: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Build one PrimFunc whose parameters after ``inputs`` are its outputs, and run it."""
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), spec.tvm_target())
    bufs = func.params[len(inputs) :]
    outs = [tvm.runtime.tensor(np.zeros([int(d) for d in b.shape], np.float32)) for b in bufs]
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], *outs)
    return [o.numpy() for o in outs]


def _check_case(spec: TargetSpec, case: _Case) -> str:
    """Schedule the case's PrimFunc, check it builds and matches numpy; the scheduled TVMScript."""
    from backends.tvm.schedule_generic import schedule_primfunc

    func, _, ref = case
    out = schedule_primfunc(func, spec)
    shapes = [[int(d) for d in p.shape] for p in func.params[:2]]
    x, y = _rand(*shapes[0]), _rand(*shapes[1], seed=1)
    for got, want in zip(_run_primfunc(spec, out, [x, y]), ref(x, y), strict=True):
        _close(got, want)
    return str(out.script())


@pytest.mark.parametrize(
    "make",
    [lambda: _split_after_unpack(2), lambda: _split_after_unpack(4), _concat_read_twice],
    ids=["split2", "split4", "concat"],
)
def test_buffer_read_by_several_blocks_is_not_reverse_inlined(make: Callable[[], _Case]) -> None:
    """reverse_compute_inline of one reader would drop the buffer the others still read (TVM 0.27
    allows it; FlattenBuffer then fails: "Buffer unpack is used before its definition")."""
    case = make()
    text = _check_case(SPECS[0], case)
    for name in case[1]:  # every reader is still its own block
        assert f'T.sblock("{name}")' in text, name
    assert text.count("T.sblock_alloc_buffer") == 1  # only the shared buffer; the add is inlined


def test_sole_reader_leaves_no_intermediate() -> None:
    text = _check_case(SPECS[0], _split_after_unpack(1))
    assert "T.sblock_alloc_buffer" not in text
