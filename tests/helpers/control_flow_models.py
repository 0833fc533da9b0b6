"""Small If / Loop / Scan ONNX models built with ``onnx.helper`` for the control-flow tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "if_model",
    "loop_cumsum_model",
    "loop_growing_model",
    "scan_cumsum_model",
    "silero_style_model",
    "unsupported_in_branch_model",
]

F = TensorProto.FLOAT


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _vi(name: str, shape: Sequence[int | str] | None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def if_model(*, cond_from_shape: bool, opset: int = 17) -> onnx.ModelProto:
    """y = If(cond, then: relu(x) * w (w an outer initializer), else: -x + b (b inside the branch)).

    With ``cond_from_shape`` the condition is ``Shape(x)[1] == 4``: constant once x's shape is bound;
    otherwise it is the graph input ``c``.
    """
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t_out"])],
        "then",
        [],
        [_vi("t_out", [2, 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Add", ["n", "b"], ["e_out"])],
        "else",
        [],
        [_vi("e_out", [2, 4])],
        initializer=[numpy_helper.from_array(np.full(4, 0.5, np.float32), "b")],
    )
    nodes = []
    inputs = [_vi("x", [2, "n"] if cond_from_shape else [2, 4])]
    if cond_from_shape:
        nodes += [
            helper.make_node("Shape", ["x"], ["sh"]),
            helper.make_node("Gather", ["sh", "one"], ["n1"], axis=0),
            helper.make_node("Equal", ["n1", "four"], ["cond"]),
        ]
    else:
        inputs.append(_vi("cond", [], TensorProto.BOOL))
    nodes.append(
        helper.make_node("If", ["cond"], ["y"], name="the_if", then_branch=then_g, else_branch=else_g)
    )
    inits = [
        numpy_helper.from_array(np.arange(4, dtype=np.float32) + 1, "w"),
        numpy_helper.from_array(np.asarray(1, np.int64), "one"),
        numpy_helper.from_array(np.asarray(4, np.int64), "four"),
    ]
    g = helper.make_graph(nodes, "if_model", inputs, [_vi("y", [2, 4])], initializer=inits)
    return _model(g, opset)


def loop_cumsum_model(trips: int = 5, opset: int = 17, *, m_input: bool = False) -> onnx.ModelProto:
    """Loop M=trips: s += x * (i + 1); outputs s_final and every s (a scan output [trips, 3]).

    With ``m_input`` the trip count M is a graph input (not known before running).
    """
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Add", ["fi", "one_f"], ["k"]),
            helper.make_node("Mul", ["x", "k"], ["xk"]),
            helper.make_node("Add", ["s_in", "xk"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["s_scan"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("s_in", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("s_out", [3]), _vi("s_scan", [3])],
        initializer=[numpy_helper.from_array(np.asarray(1, np.float32), "one_f")],
    )
    inits = [numpy_helper.from_array(np.asarray(True), "T")]
    inputs = [_vi("x", [3]), _vi("s0", [3])]
    if m_input:
        inputs.append(_vi("M", [], TensorProto.INT64))
    else:
        inits.append(numpy_helper.from_array(np.asarray(trips, np.int64), "M"))
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "T", "s0"], ["s_final", "all_s"], name="cumsum_loop", body=body)],
        "loop_model",
        inputs,
        [_vi("s_final", [3]), _vi("all_s", ["trips" if m_input else trips, 3])],
        initializer=inits,
    )
    return _model(g, opset)


def loop_growing_model(trips: int = 3) -> onnx.ModelProto:
    """A Loop whose carried value grows: s = Concat(s, x) along axis 0, with an If inside the body
    that reads a value two scopes out (``scale``) and the body's own ``i``: nested captures."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["xs"])], "then", [], [_vi("xs", [1, 2])]
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["xn"])], "else", [], [_vi("xn", [1, 2])])
    body = helper.make_graph(
        [
            helper.make_node("Equal", ["i", "one"], ["is_one"]),
            helper.make_node(
                "If", ["is_one"], ["piece"], name="inner_if", then_branch=then_g, else_branch=else_g
            ),
            helper.make_node("Concat", ["s_in", "piece"], ["s_out"], axis=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("s_in", ["k", 2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("s_out", ["k1", 2])],
        initializer=[numpy_helper.from_array(np.asarray(1, np.int64), "one")],
    )
    g = helper.make_graph(
        [
            helper.make_node("Exp", ["logscale"], ["scale"]),
            helper.make_node("Loop", ["M", "", "s0"], ["s_final"], name="grow", body=body),
        ],
        "grow_model",
        [_vi("x", [1, 2]), _vi("s0", [1, 2]), _vi("logscale", [1])],
        [_vi("s_final", ["n", 2])],
        initializer=[numpy_helper.from_array(np.asarray(trips, np.int64), "M")],
    )
    return _model(g, 17)


def scan_cumsum_model(*, reverse: bool = False, opset: int = 11) -> onnx.ModelProto:
    """Scan over axis 1 of x [2, 5, 3]: s = s + x_t * w (w captured); outputs s and every s (axis 1)."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["x_t", "w"], ["xw"]),
            helper.make_node("Add", ["s_in", "xw"], ["s_out"]),
            helper.make_node("Tanh", ["s_out"], ["y_t"]),
        ],
        "body",
        [_vi("s_in", [2, 3]), _vi("x_t", [2, 3])],
        [_vi("s_out", [2, 3]), _vi("y_t", [2, 3])],
    )
    d = 1 if reverse else 0
    scan = helper.make_node(
        "Scan",
        ["s0", "x"],
        ["s_final", "ys"],
        name="the_scan",
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[d],
        scan_output_axes=[1],
        scan_output_directions=[d],
    )
    g = helper.make_graph(
        [helper.make_node("Sigmoid", ["wx"], ["w"]), scan],
        "scan_model",
        [_vi("s0", [2, 3]), _vi("x", [2, 5, 3]), _vi("wx", [3])],
        [_vi("s_final", [2, 3]), _vi("ys", [2, 5, 3])],
    )
    return _model(g, opset)


def silero_style_model(cell: str = "LSTM", opset: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Silero-VAD style: If(sr == 16000) picks an encoder; the taken branch holds a recurrent cell.

    ``sr`` is an initializer (16000) so the condition is constant. Inside then_branch:
    ``cell`` ("LSTM", "GRU" or "MatMulTanh") over x [seq=4, batch=1, 8] with hidden 6, then
    the last hidden state through a MatMul; else_branch returns zeros of the same shape.
    """
    rng = np.random.default_rng(seed)
    hidden, inp = 6, 8
    gates = {"LSTM": 4, "GRU": 3}.get(cell, 1)
    w = rng.standard_normal((1, gates * hidden, inp)).astype(np.float32) * 0.4
    r = rng.standard_normal((1, gates * hidden, hidden)).astype(np.float32) * 0.4
    b = rng.standard_normal((1, 2 * gates * hidden)).astype(np.float32) * 0.1
    head = rng.standard_normal((hidden, 2)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"), (head, "head"))]
    if cell in ("LSTM", "GRU"):
        outs = ["Y", "Y_h"] + (["Y_c"] if cell == "LSTM" else [])
        nodes = [
            helper.make_node(cell, ["x", "W", "R", "B"], outs, hidden_size=hidden, name="rnn"),
            helper.make_node("Squeeze", ["Y_h", "zero_ax"], ["h"]),
        ]
    else:
        wt = np.ascontiguousarray(w[0].T)
        inits.append(numpy_helper.from_array(wt, "Wt"))
        nodes = [
            helper.make_node("Gather", ["x", "last"], ["x_last"], axis=0),
            helper.make_node("MatMul", ["x_last", "Wt"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h"]),
        ]
    nodes.append(helper.make_node("MatMul", ["h", "head"], ["logits"]))
    then_g = helper.make_graph(
        nodes,
        "then",
        [],
        [_vi("logits", [1, 2])],
        initializer=[
            numpy_helper.from_array(np.asarray([0], np.int64), "zero_ax"),
            numpy_helper.from_array(np.asarray(3, np.int64), "last"),
        ],
    )
    else_g = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["zeros"], value=numpy_helper.from_array(np.zeros((1, 2), np.float32))
            )
        ],
        "else",
        [],
        [_vi("zeros", [1, 2])],
    )
    g = helper.make_graph(
        [
            helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
            helper.make_node(
                "If", ["is16k"], ["out"], name="sr_switch", then_branch=then_g, else_branch=else_g
            ),
        ],
        "silero_style",
        [_vi("x", [4, 1, inp])],
        [_vi("out", [1, 2])],
        initializer=inits
        + [
            numpy_helper.from_array(np.asarray(16000, np.int64), "sr"),
            numpy_helper.from_array(np.asarray(16000, np.int64), "sr16k"),
        ],
    )
    return _model(g, opset)


def unsupported_in_branch_model() -> onnx.ModelProto:
    """An If whose else_branch holds an op Kiln has no converter for (``Unique``), next to a supported one."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", [3, 3])])
    else_g = helper.make_graph(
        [
            helper.make_node("Unique", ["x"], ["d"], name="the_unique"),
            helper.make_node("Expand", ["d", "shp"], ["e"]),
        ],
        "else",
        [],
        [_vi("e", [3, 3])],
        initializer=[numpy_helper.from_array(np.asarray([3, 3], np.int64), "shp")],
    )
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="outer_if", then_branch=then_g, else_branch=else_g)],
        "bad",
        [_vi("x", [3, 3]), _vi("c", [], TensorProto.BOOL)],
        [_vi("y", [3, 3])],
    )
    return _model(g, 17)
