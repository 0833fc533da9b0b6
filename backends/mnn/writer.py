"""Write a Kiln Graph as an ``.mnn`` file (plus its ``.weight`` side file with external weights).

``write_mnn`` lowers the graph, serializes it and writes both files, each under a
temporary name renamed into place, the side file first: a ``.mnn`` that refers to external
data never appears before its complete side file. ``kiln compile`` writes into the
driver's atomic output directory, so there both files appear together or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from backends.mnn.lower.graph import check_supported, lower_graph
from backends.mnn.lower.quant import fold_weight_dequant
from backends.mnn.options import MnnOptions
from backends.mnn.precision import WeightPlan, plan_weights
from backends.mnn.serializer import serialize
from backends.mnn.weights import WeightStorage
from compiler.input_spec import random_graph_inputs
from compiler.ir.graph import Graph
from schemas.mnn.external import side_file

__all__ = ["mnn_bytes", "write_mnn", "weight_plan"]


def weight_plan(
    graph: Graph, options: MnnOptions, feeds: Mapping[str, np.ndarray] | None = None
) -> WeightPlan:
    """The int8/int4 weight plan of ``graph`` (empty for float storage or ``min_cosine`` 0).

    ``feeds`` default to seeded random normal inputs, as ``kiln compile`` verifies without
    ``--inputs``. Node ids are ``graph``'s (folding weight dequantization keeps them).
    """
    if options.target_cosine <= 0.0:
        return WeightPlan()
    graph = fold_weight_dequant(graph)
    if feeds is None:
        feeds = random_graph_inputs(graph, 0)
    return plan_weights(graph, options, feeds)


def mnn_bytes(
    graph: Graph,
    options: MnnOptions,
    source: str = "",
    feeds: Mapping[str, np.ndarray] | None = None,
    storage: Mapping[int, WeightStorage] | None = None,
) -> tuple[bytes, bytes | None]:
    """The ``.mnn`` bytes of ``graph`` and its side-file bytes (None without external weights).

    ``feeds`` are the inputs the int8/int4 weight plan is measured on (default: seeded
    random normal inputs, as ``kiln compile`` verifies without ``--inputs``). ``storage``
    gives the per-node weight storage directly (node id -> storage) and skips the plan, e.g.
    to re-write a model read from an ``.mnn`` with the storage it had.
    """
    graph = fold_weight_dequant(graph)
    check_supported(graph, source)
    if storage is None:
        storage = weight_plan(graph, options, feeds).storage
    net, external = lower_graph(graph, options, source, storage)
    data = serialize(net)
    return data, (external.getvalue() if external is not None else None)


def write_mnn(
    graph: Graph,
    path: Path,
    options: MnnOptions,
    source: str = "",
    feeds: Mapping[str, np.ndarray] | None = None,
    storage: Mapping[int, WeightStorage] | None = None,
) -> list[Path]:
    """Write ``path`` (and ``path.weight`` with external weights); returns the files written.

    Files are written under temporary names in the destination folder and renamed into
    place, the side file first.
    """
    path = Path(path)
    data, side = mnn_bytes(graph, options, source, feeds, storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    targets = ([(side_file(path), side)] if side is not None else []) + [(path, data)]
    for target, content in targets:
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            tmp.write_bytes(content)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(target)
    if side is None:
        side_file(path).unlink(missing_ok=True)
    return written
