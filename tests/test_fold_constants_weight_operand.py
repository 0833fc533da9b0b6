"""fold-constants lifts its growth cap for data-independent operands of linear ops.

A position grid built at run time (Expand of an iota to a 1x128x128 grid: 128x its input) that
reaches a MatMul through data-independent nodes only is folded, and the MatMul folds with it;
the same grid read by an elementwise op, or reaching the MatMul through an activation, is not.
"""

from __future__ import annotations

import numpy as np
import onnx

from frontends.onnx.loader import load_onnx
from passes.fold_constants import fold_reason, weight_operand_cone
from tests.helpers.onnx_text import rand, text_model
from tests.helpers.pass_check import assert_pass_matches_ort, op_counts, run_passes

N = 128
X = {"x": rand(1, N, 8, seed=1)}
IOTA = np.arange(N, dtype=np.float32) / N
SHAPE = np.array([1, N, N], np.int64)
GROWTH = f"output ({N * N}) would be {N * N // (N + 3)}x its inputs"  # iota and shape: N + 3
PIPE = ["fold-constants", "eliminate-dead-nodes"]


def grid_model(body: str, extra: str = "", **inits: np.ndarray) -> onnx.ModelProto:
    """y from x and grid = Expand(iota, [1, N, N]) by ``body``; ``extra``: more graph inputs."""
    arrays = {"iota": IOTA, "shp": SHAPE, "w": rand(N, 8, seed=2), **inits}
    graph = f"""g (float[1,{N},8] x{extra}) => (float[1,{N},8] y) {{
             grid = Expand(iota, shp)
             {body}
           }}"""
    return text_model(graph, 17, 8, **arrays)


def test_grid_feeding_a_matmul_folds_with_it() -> None:
    m = grid_model("""t = Transpose<perm=[0,2,1]>(grid)
             pos = MatMul(t, w)
             y = Add(x, pos)""")
    g = load_onnx(m)
    cone = weight_operand_cone(g)
    assert {g.node(n).op for n in cone} == {"Expand", "Transpose"}
    expand = next(n for n in g.ops() if n.op == "Expand")
    assert fold_reason(g, expand, 1 << 22, 4.0) == GROWTH
    assert fold_reason(g, expand, 1 << 22, 4.0, weight_operand=True) is None
    g = assert_pass_matches_ort(m, PIPE, X, max_rel=1e-6)
    assert op_counts(g) == {"Add": 1}  # grid, Transpose and MatMul folded into one constant
    assert not run_passes(g, ["fold-constants"]).changed  # idempotent


def test_must_not_fire_on_elementwise_readers_or_through_activations() -> None:
    # the grid only meets elementwise ops: a broadcast the file need not store
    m = grid_model(
        """s = ReduceSum<keepdims=1>(grid, ax)
             z = Add(x, x)
             y = Add(z, s)""",
        ax=np.array([2], np.int64),
    )
    g = load_onnx(m)
    assert not weight_operand_cone(g)
    assert not run_passes(g, PIPE).changed
    assert op_counts(g)["Expand"] == 1
    # the grid reaches the MatMul only through an activation: data-dependent, nothing to fold
    m = grid_model(
        """gx = Mul(grid, xs)
             pos = MatMul(gx, w)
             y = Add(x, pos)""",
        ", float[1,1,128] xs",
    )
    g = load_onnx(m)
    assert not weight_operand_cone(g)
    assert not run_passes(g, PIPE).changed
    assert op_counts(g) == {"Expand": 1, "Mul": 1, "MatMul": 1, "Add": 1}
    expand = next(n for n in g.ops() if n.op == "Expand")
    assert fold_reason(g, expand, 1 << 22, 4.0) == GROWTH


def test_element_cap_still_holds_on_weight_operands() -> None:
    m = grid_model("""t = Transpose<perm=[0,2,1]>(grid)
             pos = MatMul(t, w)
             y = Add(x, pos)""")
    g = load_onnx(m)
    assert not run_passes(g, ["fold-constants{max_elements=1000}"]).changed
    expand = next(n for n in g.ops() if n.op == "Expand")
    assert fold_reason(g, expand, 1000, 4.0, weight_operand=True) == f"output has {N * N} elements > cap 1000"
