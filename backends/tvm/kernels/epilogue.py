"""Fused conv epilogues as TE stages: ``y = act(acc + bias[c] (+ residual))``.

Activation math follows ONNX exactly:

* relu ``max(x, 0)``; relu6 ``min(max(x, 0), 6)``; clip ``min(max(x, alpha), beta)``;
* leaky_relu ``x if x >= 0 else alpha * x``;
* sigmoid ``1 / (1 + exp(-x))``; tanh;
* hard_sigmoid ``max(0, min(1, alpha * x + beta))``;
* hard_swish ``x * max(0, min(1, x / 6 + 0.5))`` (ONNX HardSwish).

exp and tanh are :mod:`backends.tvm.kernels.fast_math`'s vectorizable forms.
"""

from __future__ import annotations

from typing import Any

from backends.tvm.kernels.fast_math import fast_sigmoid, fast_tanh

__all__ = ["ACTIVATIONS", "activation_expr", "epilogue_stage"]

ACTIVATIONS = (
    "none",
    "relu",
    "relu6",
    "clip",
    "leaky_relu",
    "sigmoid",
    "hard_sigmoid",
    "hard_swish",
    "tanh",
)


def activation_expr(x: Any, activation: str, alpha: float, beta: float) -> Any:
    """The TIR expression ``act(x)`` for a float32 expression ``x``."""
    from tvm import te, tirx

    def c(v: float) -> Any:
        return tirx.const(float(v), "float32")

    if activation == "none":
        return x
    if activation == "relu":
        return te.max(x, c(0.0))
    if activation == "relu6":
        return te.min(te.max(x, c(0.0)), c(6.0))
    if activation == "clip":
        return te.min(te.max(x, c(alpha)), c(beta))
    if activation == "leaky_relu":
        return tirx.Select(x >= c(0.0), x, x * c(alpha))
    if activation == "sigmoid":
        return fast_sigmoid(x)
    if activation == "tanh":
        return fast_tanh(x)
    if activation == "hard_sigmoid":
        return te.max(c(0.0), te.min(c(1.0), x * c(alpha) + c(beta)))
    if activation == "hard_swish":
        return x * te.max(c(0.0), te.min(c(1.0), x * c(1.0 / 6.0) + c(0.5)))
    raise ValueError(f"unknown activation {activation!r} (choose from {', '.join(ACTIVATIONS)})")


def epilogue_stage(
    acc: Any, bias: Any, residual: Any | None, activation: str, alpha: float, beta: float
) -> Any:
    """The output stage over ``acc [N, OCc, OH, OW, ob]``: ``act(acc + bias[oc, ob] (+ residual))``."""
    from tvm import te

    def body(n: Any, oc: Any, oh: Any, ow: Any, ob: Any) -> Any:
        v = acc[n, oc, oh, ow, ob] + bias[oc, ob]
        if residual is not None:
            v = v + residual[n, oc, oh, ow, ob]
        return activation_expr(v, activation, alpha, beta)

    return te.compute(acc.shape, body, name="epilogue")
