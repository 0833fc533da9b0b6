"""Graphs of ``kiln::WeightOnlyMatMul`` layers with random levels, scales and zero points.

A layer is ``(a_shape, n, bits, block, scale_dtype, symmetric, bias)``: A of ``a_shape`` (K is its
last dimension) times N = ``n`` output columns, with ``bits``-bit levels in blocks of ``block``
along K, ``"fp16"`` or ``"fp32"`` scales, an int8 zero point per block unless ``symmetric``, and a
float bias when ``bias``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.types import DType, TensorType
from compiler.ops.fused import KILN
from compiler.ops.weight_only import WeightOnlyMatMulAttrs, block_count, level_range

__all__ = ["Layer", "weight_only_graph"]

Layer = tuple[tuple[int, ...], int, int, int, str, bool, bool]


def weight_only_graph(layers: Sequence[Layer], seed: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """One graph input ``a<i>`` and output ``y<i>`` per layer, and random feeds for the inputs."""
    rng = np.random.default_rng(seed)
    g = Graph("wo")
    feeds: dict[str, np.ndarray] = {}
    outs = []
    for i, (shape, n, bits, block, sd, sym, bias) in enumerate(layers):
        k = shape[-1]
        lo, hi = level_range(bits)
        nb = block_count(k, block)
        feeds[f"a{i}"] = rng.standard_normal(shape).astype(np.float32)
        ins = [
            g.add_input(f"a{i}", TensorType(DType.FLOAT32, shape)),
            g.add_constant(rng.integers(lo, hi + 1, (n, k)).astype(np.int8), f"q{i}"),
            g.add_constant(
                rng.uniform(0.001, 0.05, (n, nb)).astype(np.float16 if sd == "fp16" else np.float32)
            ),
            None if sym else g.add_constant(rng.integers(lo, hi + 1, (n, nb)).astype(np.int8), f"z{i}"),
            g.add_constant(rng.standard_normal(n).astype(np.float32), f"b{i}") if bias else None,
        ]
        while ins[-1] is None:
            ins.pop()
        node = g.add_node(
            "WeightOnlyMatMul", ins, WeightOnlyMatMulAttrs(bits, block), domain=KILN, name=f"y{i}"
        )
        outs.append(g.value(node))
    g.set_outputs(outs)
    return g, feeds
