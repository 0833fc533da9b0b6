"""Decompositions of the exp-based activations and Softsign into elementwise ops.

* softplus-stable: Softplus(x) = relu(x) + log(exp(-|x|) + 1). Equal to log(1 + exp(x)) in real
  arithmetic, and stable: exp(-|x|) <= 1 never overflows (log(1 + exp(x)) is inf from x = 89).
  In float32, where exp(-|x|) < 2^-24 (x < -16.6) the sum rounds to 1 and y to 0: an absolute
  error below 6e-8, as in onnxruntime's own kernel near there.
* mish-softplus: Mish(x) = x * tanh(Softplus(x)) (Softplus native or through softplus-stable).
* selu-minmax: Selu(x) = gamma * (relu(x) + min(alpha * (exp(x) - 1), 0)) for alpha > 0: for
  x > 0 the min term is 0 and relu(x) = x; for x <= 0 relu(x) = 0 and alpha * (exp(x) - 1) <= 0.
* celu-minmax: Celu(x) = relu(x) + min(alpha * (exp(x / alpha) - 1), 0), ONNX's definition.
* softsign-div: Softsign(x) = x / (1 + |x|).
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node, Value
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import (
    base_name,
    first_input,
    float_input_reason,
    replace_outputs,
    scalar_const,
)

__all__ = ["SOFTPLUS_STABLE", "MISH_SOFTPLUS", "SELU_MINMAX", "CELU_MINMAX", "SOFTSIGN_DIV"]


def softplus(rw: Rewriter, x: Value, b: str, name: str) -> Value:
    """relu(x) + log(exp(-|x|) + 1), the last node named ``name``."""
    e = rw.op("Exp", [rw.op("Neg", [rw.op("Abs", [x], name=f"{b}_abs")], name=f"{b}_nabs")], name=f"{b}_exp")
    lg = rw.op(
        "Log", [rw.op("Add", [e, scalar_const(rw, x, 1.0, f"{b}_one")], name=f"{b}_1p")], name=f"{b}_log"
    )
    return rw.op("Add", [rw.op("Relu", [x], name=f"{b}_relu"), lg], name=name)


def _softplus_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    b = base_name(node)
    replace_outputs(rw, node, [softplus(rw, first_input(graph, node), b, b)])


SOFTPLUS_STABLE = register_decomposition(
    Decomposition(
        "softplus-stable",
        "Softplus",
        ("Relu", "Abs", "Neg", "Exp", "Add", "Log"),
        float_input_reason,
        _softplus_rewrite,
        "Softplus(x) = relu(x) + log(exp(-|x|) + 1)",
    )
)


def _mish_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    t = rw.op("Tanh", [rw.op("Softplus", [x], name=f"{b}_softplus")], name=f"{b}_tanh")
    replace_outputs(rw, node, [rw.op("Mul", [x, t], name=b)])


MISH_SOFTPLUS = register_decomposition(
    Decomposition(
        "mish-softplus",
        "Mish",
        ("Softplus", "Tanh", "Mul"),
        float_input_reason,
        _mish_rewrite,
        "Mish(x) = x * tanh(softplus(x))",
    )
)


def _exp_minus_one_min(rw: Rewriter, x: Value, alpha: float, b: str, divide: bool) -> Value:
    """relu(x) + min(alpha * (exp(x [/ alpha]) - 1), 0)."""
    arg = rw.op("Div", [x, scalar_const(rw, x, alpha, f"{b}_alpha_d")], name=f"{b}_scaled") if divide else x
    em1 = rw.op(
        "Sub", [rw.op("Exp", [arg], name=f"{b}_exp"), scalar_const(rw, x, 1.0, f"{b}_one")], name=f"{b}_em1"
    )
    neg = rw.op(
        "Min",
        [
            rw.op("Mul", [em1, scalar_const(rw, x, alpha, f"{b}_alpha")], name=f"{b}_a_em1"),
            scalar_const(rw, x, 0.0, f"{b}_zero"),
        ],
        name=f"{b}_neg",
    )
    return rw.op("Add", [rw.op("Relu", [x], name=f"{b}_relu"), neg], name=f"{b}_sum")


def _selu_check(graph: Graph, node: Node) -> str | None:
    why = float_input_reason(graph, node)
    if why:
        return why
    return None if node.attrs.alpha > 0 else f"alpha={node.attrs.alpha:g} is not positive"


def _selu_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    s = _exp_minus_one_min(rw, x, node.attrs.alpha, b, divide=False)
    replace_outputs(
        rw, node, [rw.op("Mul", [s, scalar_const(rw, x, node.attrs.gamma, f"{b}_gamma")], name=b)]
    )


SELU_MINMAX = register_decomposition(
    Decomposition(
        "selu-minmax",
        "Selu",
        ("Relu", "Exp", "Sub", "Mul", "Min", "Add"),
        _selu_check,
        _selu_rewrite,
        "Selu(x) = gamma * (relu(x) + min(alpha * (exp(x) - 1), 0)) for alpha > 0",
    )
)


def _celu_check(graph: Graph, node: Node) -> str | None:
    why = float_input_reason(graph, node)
    if why:
        return why
    return None if node.attrs.alpha != 0 else "alpha is 0"


def _celu_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    y = _exp_minus_one_min(rw, x, node.attrs.alpha, b, divide=True)
    replace_outputs(rw, node, [y])


CELU_MINMAX = register_decomposition(
    Decomposition(
        "celu-minmax",
        "Celu",
        ("Div", "Exp", "Sub", "Mul", "Min", "Relu", "Add"),
        _celu_check,
        _celu_rewrite,
        "Celu(x) = relu(x) + min(alpha * (exp(x / alpha) - 1), 0)",
    )
)


def _softsign_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    x, b = first_input(graph, node), base_name(node)
    den = rw.op(
        "Add", [rw.op("Abs", [x], name=f"{b}_abs"), scalar_const(rw, x, 1.0, f"{b}_one")], name=f"{b}_den"
    )
    replace_outputs(rw, node, [rw.op("Div", [x, den], name=b)])


SOFTSIGN_DIV = register_decomposition(
    Decomposition(
        "softsign-div",
        "Softsign",
        ("Abs", "Add", "Div"),
        float_input_reason,
        _softsign_rewrite,
        "Softsign(x) = x / (1 + |x|)",
    )
)
