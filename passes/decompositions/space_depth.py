"""Decompositions of DepthToSpace and SpaceToDepth into Reshape, Transpose, Reshape.

For x of shape [N, C, H, W] and block b (N may be dynamic: Reshape's 0 copies it):

* depth-to-space: DCR: y = reshape(transpose(reshape(x, [N, b, b, C/b², H, W]), [0, 3, 4, 1, 5, 2]),
  [N, C/b², H·b, W·b]); CRD: reshape to [N, C/b², b, b, H, W] and permute [0, 1, 4, 2, 5, 3].
* space-to-depth: y = reshape(transpose(reshape(x, [N, C, H/b, b, W/b, b]), [0, 3, 5, 1, 2, 4]),
  [N, C·b², H/b, W/b]).

These are ONNX's definitions; pure data movement, so exact.
"""

from __future__ import annotations

from compiler.ir.graph import Graph, Node
from compiler.rewriter import Rewriter
from passes.decompositions import Decomposition, register_decomposition
from passes.decompositions._util import base_name, first_input, ints, replace_outputs

__all__ = ["DEPTH_TO_SPACE", "SPACE_TO_DEPTH"]

_PERMS = {"DCR": (0, 3, 4, 1, 5, 2), "CRD": (0, 1, 4, 2, 5, 3), "S2D": (0, 3, 5, 1, 2, 4)}


def _check(graph: Graph, node: Node) -> str | None:
    shape = first_input(graph, node).type.shape
    if shape is None or len(shape) != 4:
        return "x is not 4-D"
    if not all(isinstance(d, int) for d in shape[1:]):
        return "C, H or W is not static (fix it with --input-shape)"
    return None


def _chw(graph: Graph, node: Node) -> tuple[int, int, int]:
    shape = first_input(graph, node).type.shape
    assert shape is not None
    c, h, w = shape[1:]
    assert isinstance(c, int) and isinstance(h, int) and isinstance(w, int)
    return c, h, w


def _move(
    rw: Rewriter, graph: Graph, node: Node, split: list[int], perm: tuple[int, ...], out: list[int]
) -> None:
    x, b = first_input(graph, node), base_name(node)
    r = rw.op("Reshape", [x, ints(rw, [0, *split], f"{b}_split_shape")], name=f"{b}_split")
    t = rw.op("Transpose", [r], {"perm": perm}, name=f"{b}_perm")
    replace_outputs(rw, node, [rw.op("Reshape", [t, ints(rw, [0, *out], f"{b}_shape")], name=b)])


def _d2s_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    (c, h, w), k = _chw(graph, node), node.attrs.blocksize
    mode = node.attrs.mode
    split = [k, k, c // (k * k), h, w] if mode == "DCR" else [c // (k * k), k, k, h, w]
    _move(rw, graph, node, split, _PERMS[mode], [c // (k * k), h * k, w * k])


def _s2d_rewrite(rw: Rewriter, graph: Graph, node: Node) -> None:
    (c, h, w), k = _chw(graph, node), node.attrs.blocksize
    _move(rw, graph, node, [c, h // k, k, w // k, k], _PERMS["S2D"], [c * k * k, h // k, w // k])


DEPTH_TO_SPACE = register_decomposition(
    Decomposition(
        "depth-to-space",
        "DepthToSpace",
        ("Reshape", "Transpose"),
        _check,
        _d2s_rewrite,
        "DepthToSpace(x) = reshape(transpose(reshape(x, 6-D), perm by mode), [N, C/b², H·b, W·b])",
    )
)
SPACE_TO_DEPTH = register_decomposition(
    Decomposition(
        "space-to-depth",
        "SpaceToDepth",
        ("Reshape", "Transpose"),
        _check,
        _s2d_rewrite,
        "SpaceToDepth(x) = reshape(transpose(reshape(x, [N, C, H/b, b, W/b, b]), perm), [N, C·b², H/b, W/b])",
    )
)
