"""fuse-quantized-ops{conv1d=1} (TVM's legalization): a QDQ 1-D conv (rank-3 x, whisper's front end)
becomes Squeeze(kiln::QConv(Unsqueeze(x_q, [2]), W_q[:, :, None]), [2]) with the window (1, k), so
it runs on the int8 conv kernel instead of a float conv on dequantized weights. Structure (one
QConv, no float Conv), the must-not-fire default (``conv1d=0``: MNN and CANN keep refusing rank 3),
and the compiled TVM CPU artifact against onnxruntime on the QDQ model (+-1 LSB on the uint8 output,
float out within float32 rounding of the exact integer product).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm

from compiler.pass_infra import PassContext
from compiler.pipelines import tvm_legalization
from frontends.onnx.loader import load_onnx
from tests.helpers.numerics import assert_close
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import op_counts, ort, run_passes

PASS = "fuse-quantized-ops"
X_SCALE, Y_SCALE = 0.03, 0.05
LSB = 1
FLOAT_RTOL = 1e-5  # |a - e| <= FLOAT_RTOL * max(1, max|e|) for the float-out conv

CONV1D = """g (float[1,24,37] x) => (float[1,16,{length}] y) {{
     xq = QuantizeLinear(x, xs, xz)
     xd = DequantizeLinear(xq, xs, xz)
     wd = DequantizeLinear<axis=0>(wq, ws, wz)
     bd = DequantizeLinear<axis=0>(bq, bs, bz)
     c = Conv<kernel_shape=[3], pads=[1,1], strides=[{stride}]>(xd, wd, bd)
     {tail}
   }}"""
QUANT_TAIL = "yq = QuantizeLinear(c, ys, yz)\n     y = DequantizeLinear(yq, ys, yz)"
FLOAT_TAIL = "y = Relu(c)"


def conv1d_model(stride: int, quantized_out: bool) -> onnx.ModelProto:
    """x [1, 24, 37] -> q -> dq -> Conv1d(k=3, pads 1, stride) with per-channel int8 W and int32 bias."""
    rng = np.random.default_rng(7)
    ws = rng.uniform(0.004, 0.02, 16).astype(np.float32)
    bs = (np.float64(np.float32(X_SCALE)) * ws.astype(np.float64)).astype(np.float32)
    length = (37 + 2 - 3) // stride + 1
    text = CONV1D.format(length=length, stride=stride, tail=QUANT_TAIL if quantized_out else FLOAT_TAIL)
    consts: dict[str, np.ndarray] = {
        "xs": np.array(X_SCALE, np.float32),
        "xz": np.array(122, np.uint8),
        "wq": rng.integers(-127, 128, (16, 24, 3)).astype(np.int8),
        "ws": ws,
        "wz": np.zeros(16, np.int8),
        "bq": rng.integers(-3000, 3000, 16).astype(np.int32),
        "bs": bs,
        "bz": np.zeros(16, np.int32),
        "ys": np.array(Y_SCALE, np.float32),
        "yz": np.array(128, np.uint8),
    }
    if not quantized_out:
        consts = {k: v for k, v in consts.items() if k not in ("ys", "yz")}
    return text_model(text, opset=21, ir_version=10, **consts)


def test_default_refuses_rank_3_and_says_why() -> None:
    """Must-not-fire: without conv1d=1 (MNN, CANN) the 1-D conv stays in QDQ form."""
    g = load_onnx(conv1d_model(1, True))
    ctx = PassContext()
    assert not run_passes(g, [PASS], ctx).changed
    assert ("quantized-conv", "input x has rank 3, not 4") in {(m.rule, m.reason) for m in ctx.near_misses}
    assert op_counts(g)["Conv"] == 1 and op_counts(g)["kiln::QConv"] == 0


def test_tvm_legalization_fuses_1d_convs() -> None:
    assert f"{PASS}{{conv1d=1}}" in [str(i) for i in tvm_legalization("cpu", 16)]
    g = load_onnx(conv1d_model(2, True))
    assert run_passes(g, [f"{PASS}{{conv1d=1}}"]).applied == {"quantized-conv": 1}
    counts = op_counts(g)
    assert counts["kiln::QConv"] == 1 and counts["Conv"] == 0
    assert counts["Unsqueeze"] == 1 and counts["Squeeze"] == 1
    (node,) = [n for n in g.ops() if n.op == "QConv"]
    a = node.attrs
    assert (tuple(a.kernel_shape), tuple(a.strides), tuple(a.pads)) == ((1, 3), (1, 2), (0, 1, 0, 1))
    w = g.inputs_of(node)[1]
    assert w is not None and w.type.static_shape == (16, 24, 1, 3)
    assert not run_passes(g, [f"{PASS}{{conv1d=1}}"]).changed  # idempotent


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("quantized_out", [True, False], ids=["uint8-out", "float-out"])
def test_tvm_cpu_int8_conv1d_matches_ort(stride: int, quantized_out: bool) -> None:
    from tvm import relax

    from backends.tvm.build import compile_module
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    model = conv1d_model(stride, quantized_out)
    target = resolve_target("cpu")
    g, _ = prepare_graph(load_onnx(model), target)
    counts = op_counts(g)
    assert counts["kiln::QConv"] == 1 and counts["Conv"] == counts["kiln::FusedConv"] == 0
    lowered = lower_graph(g, target)
    assert any(k["rule"].startswith("qconv2d") for k in lowered.kernels), lowered.kernels
    vm = relax.VirtualMachine(compile_module(lowered.mod, target), tvm.cpu())
    x = rand(1, 24, 37, seed=8, scale=1.5)
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    ref = ort(model, {"x": x})["y"]
    assert got.shape == ref.shape
    if quantized_out:
        assert len(np.unique(ref)) > 20  # the test spans the grid
        assert_close(got, ref, rtol=0.0, atol=Y_SCALE * LSB * (1 + 1e-6))
    else:
        assert_close(got, ref, rtol=0.0, atol=FLOAT_RTOL * max(1.0, float(np.abs(ref).max())))
