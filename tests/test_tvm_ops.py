"""Each TVM lowering rule on one op, against onnxruntime running the same op (fp32, 1e-5).

The op runs as a one-node Kiln graph (marked inputs as constants) lowered to Relax,
compiled with Kiln's pipeline for the host and executed in the Relax VM.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.tvm.build import compile_module
from backends.tvm.emit import prepare_graph
from backends.tvm.lower import lower_graph
from backends.tvm.target import resolve_target
from compiler.errors import UnsupportedOpsError
from compiler.ir.graph import Graph, Value
from compiler.ir.types import TensorType
from tests.helpers.numerics import assert_close
from tests.helpers.single_op import run_ort

R = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def run_tvm_op(
    op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], consts: set[int], num_outputs: int
) -> list[np.ndarray]:
    """Lower, compile and run a one-node graph."""
    import tvm
    from tvm import relax

    g = Graph("op")
    vals: list[Value | None] = []
    feeds = []
    for i, x in enumerate(inputs):
        if x is None:
            vals.append(None)
        elif i in consts:
            vals.append(g.add_constant(x, f"c{i}"))
        else:
            vals.append(g.add_input(f"in{i}", TensorType.of(x)))
            feeds.append(x)
    node = g.add_node(op, vals, attrs, num_outputs=num_outputs)
    g.set_outputs(g.outputs_of(node))
    target = resolve_target("cpu")
    legal, _ = prepare_graph(g, target)  # the backend's legalization (normalize-gemm, layouts...)
    ex = compile_module(lower_graph(legal, target).mod, target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(x, tvm.cpu()) for x in feeds])
    outs = [res] if num_outputs == 1 else [res[i] for i in range(num_outputs)]
    return [o.numpy() for o in outs]


CASES: list[tuple[str, str, list[np.ndarray | None], dict[str, Any], set[int], int]] = [
    ("gather_neg", "Gather", [_f(3, 5, 4), _i64(-1, 0, 2)], {"axis": 1}, {1}, 1),
    ("gather_scalar", "Gather", [_f(1, 5, 4), np.array(2, np.int64)], {"axis": 1}, {1}, 1),  # ViT cls token
    ("expand", "Expand", [_f(3, 1, 4), _i64(2, 3, 5, 4)], {}, {1}, 1),
    ("tile", "Tile", [_f(2, 3), _i64(2, 3)], {}, {1}, 1),
    ("split", "Split", [_f(2, 10, 3), _i64(3, 7)], {"axis": 1}, {1}, 2),
    ("pad", "Pad", [_f(1, 2, 4, 5), _i64(0, 0, 1, 2, 0, 0, 3, 1), np.array(0.5, np.float32)], {}, {1, 2}, 1),
    (
        "batchnorm",
        "BatchNormalization",
        [_f(2, 3, 4, 5), _f(3), _f(3), _f(3), np.abs(_f(3)) + 0.5],
        {"epsilon": 1e-3},
        {1, 2, 3, 4},
        1,
    ),
    ("instancenorm", "InstanceNormalization", [_f(2, 3, 4, 5), _f(3), _f(3)], {}, {1, 2}, 1),
    ("layernorm", "LayerNormalization", [_f(2, 3, 8), _f(8), _f(8)], {"axis": -1}, {1, 2}, 1),
    ("prelu", "PRelu", [_f(1, 3, 4, 4), _f(3, 1, 1)], {}, {1}, 1),
    ("elu", "Elu", [_f(3, 7)], {"alpha": 0.7}, set(), 1),
    ("softplus", "Softplus", [_f(3, 7)], {}, set(), 1),
    ("sum3", "Sum", [_f(2, 3), _f(1, 3), _f(2, 1)], {}, set(), 1),
    ("mean2", "Mean", [_f(2, 3), _f(2, 3)], {}, set(), 1),
    (
        "conv_transpose",
        "ConvTranspose",
        [_f(1, 4, 5, 5), _f(4, 3, 3, 3), _f(3)],
        {"strides": [2, 2], "pads": [1, 1, 0, 0], "output_padding": [1, 1]},
        {1, 2},
        1,
    ),
    ("resize_nearest", "Resize", [_f(1, 2, 3, 4), None, np.array([1, 1, 2, 2], np.float32)], {}, {2}, 1),
    (
        "resize_linear",
        "Resize",
        [_f(1, 2, 3, 4), None, np.array([1, 1, 2, 3], np.float32)],
        {"mode": "linear"},
        {2},
        1,
    ),
    ("slice", "Slice", [_f(4, 6), _i64(1, -4), _i64(100, -1), _i64(0, 1), _i64(1, 2)], {}, {1, 2, 3, 4}, 1),
    ("softmax", "Softmax", [_f(2, 5, 3)], {"axis": 1}, set(), 1),
    (
        "maxpool_ceil",
        "MaxPool",
        [_f(1, 3, 7, 7)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        set(),
        1,
    ),
    ("gemm_transb", "Gemm", [_f(2, 8), _f(5, 8), _f(5)], {"transB": 1}, {1, 2}, 1),
    ("gemm_alpha", "Gemm", [_f(2, 8), _f(8, 5), _f(1, 5)], {"alpha": 0.5, "beta": 2.0}, {1, 2}, 1),
]


@pytest.mark.parametrize(
    ("case", "op", "inputs", "attrs", "consts", "nout"), CASES, ids=[c[0] for c in CASES]
)
def test_op_matches_onnxruntime(
    case: str, op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], consts: set[int], nout: int
) -> None:
    got = run_tvm_op(op, inputs, attrs, consts, nout)
    ref = run_ort(op, inputs, attrs, num_outputs=nout)
    for i, (a, e) in enumerate(zip(got, ref, strict=True)):
        assert_close(a, e, rtol=1e-5, atol=1e-5, what=f"{case} output {i}")


def test_op_without_a_rule_is_reported_by_node() -> None:
    from frontends.onnx.loader import load_onnx
    from tests.helpers.control_flow_models import loop_cumsum_model

    g = load_onnx(loop_cumsum_model(m_input=True))  # a Loop whose trip count is an input: no rule
    with pytest.raises(UnsupportedOpsError, match="Loop.*cumsum_loop"):
        lower_graph(g, resolve_target("cpu"), "m.onnx")
