"""``--mnn-gelu auto``: write MNN's fast GELU kernel only where the compile inputs show it is safe.

MNN's UnaryOp GELU (the tanh form, what MNN's converter writes) is up to 4.7e-4 from the erf GELU
per element (:mod:`backends.mnn.lower.gelu`); how much of that reaches the outputs depends on the
model: 1.0e-4 on vit_tiny, 1.27e-3 on maxvit_pico (observed, max rel against onnxruntime), where
the fp32-approx tolerance is 1e-3. So the emitter writes the file both ways, runs both in MNN's
runtime on the compile inputs (``--inputs``, else the seeded random inputs verification uses) and
keeps the fast one where

    max_o max|y_fast,o - y_exact,o| / max(1, max|y_exact,o|) <= GELU_AUTO_MAX_REL

(the exact file is itself within 1e-5 of the erf GELU model, so this is the fast kernel's own
error; the bound is half the fp32-approx tolerance, a margin for inputs the compile did not see).
Otherwise the exact chain is written. The manifest records the choice and the measured error.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from backends.mnn.options import MnnOptions
from backends.mnn.weights import WeightStorage
from compiler.ir.graph import Graph
from compiler.metrics import agreement

__all__ = ["GELU_AUTO_MAX_REL", "resolve_gelu"]

GELU_AUTO_MAX_REL = 5e-4


def resolve_gelu(
    graph: Graph,
    options: MnnOptions,
    feeds: Mapping[str, np.ndarray],
    source: str = "",
    storage: Mapping[int, WeightStorage] | None = None,
) -> tuple[MnnOptions, dict[str, Any] | None]:
    """``options`` with ``gelu`` decided (``auto`` -> ``mnn`` or ``exact``), and the manifest record
    (None where nothing was measured: no Gelu in the graph, or the form was given)."""
    if options.gelu != "auto":
        return options, None
    exact = dataclasses.replace(options, gelu="exact")
    if not any(n.op == "Gelu" for n in graph.ops()):
        return exact, None
    from backends.mnn.runtime import run_mnn
    from backends.mnn.writer import write_mnn

    fast = dataclasses.replace(options, gelu="mnn")
    with tempfile.TemporaryDirectory(prefix="kiln-mnn-gelu-") as tmp:
        outs = []
        for form, opts in (("exact", exact), ("mnn", fast)):
            path = write_mnn(graph, Path(tmp) / form / "model.mnn", opts, source, storage=storage)[-1]
            outs.append(run_mnn(path, feeds))
    ref, got = outs
    worst = max(agreement(got[k].reshape(ref[k].shape), ref[k]).max_rel for k in ref)
    chosen = fast if worst <= GELU_AUTO_MAX_REL else exact
    record = {
        "chosen": chosen.gelu,
        "max_rel_mnn_vs_exact": float(f"{worst:.4g}"),
        "bound": GELU_AUTO_MAX_REL,
    }
    return chosen, record
