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

Where the all-fast file misses the bound, the error usually comes from a few GELUs whose
deviation the rest of the network amplifies (maxvit_pico: its first GELU alone, fast with all
others exact, gives 7.9e-4; each of its last eight under 3e-5). So each GELU g is measured alone,
e_g = err(g fast, all others exact), the GELUs are ranked by e_g (largest first), and the fewest
k such that err(the first k exact, the rest fast) <= GELU_AUTO_MAX_REL is found by bisection
(err(0) > bound was measured, err(n) = 0): n + log2(n) + 2 MNN runs in all. The chosen file is one
of the measured ones, so its error is known; where k = n the exact chain is written throughout.
The manifest records the choice (``mnn``, ``mixed`` or ``exact``), the exact GELUs and the errors.
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
    """``options`` with ``gelu`` decided (``auto`` -> ``mnn``, ``mnn`` with ``gelu_exact_nodes``, or
    ``exact``), and the manifest record
    (None where nothing was measured: no Gelu in the graph, or the form was given)."""
    if options.gelu != "auto":
        return options, None
    exact = dataclasses.replace(options, gelu="exact")
    if not any(n.op == "Gelu" for n in graph.ops()):
        return exact, None
    from backends.mnn.runtime import run_mnn
    from backends.mnn.writer import write_mnn

    fast = dataclasses.replace(options, gelu="mnn")
    gelus = [n.name for n in graph.ops() if n.op == "Gelu"]
    with tempfile.TemporaryDirectory(prefix="kiln-mnn-gelu-") as tmp:
        runs = 0

        def run(opts: MnnOptions) -> dict[str, np.ndarray]:
            nonlocal runs
            runs += 1
            path = write_mnn(graph, Path(tmp) / str(runs) / "model.mnn", opts, source, storage=storage)[-1]
            return run_mnn(path, feeds)

        ref = run(exact)

        def error(exact_nodes: tuple[str, ...]) -> float:
            got = run(dataclasses.replace(fast, gelu_exact_nodes=exact_nodes))
            return max(agreement(got[k].reshape(ref[k].shape), ref[k]).max_rel for k in ref)

        worst = error(())
        exact_nodes: tuple[str, ...] = ()
        chosen, chosen_error = fast, worst
        if worst > GELU_AUTO_MAX_REL:
            chosen, chosen_error = exact, 0.0
            if len(gelus) > 1:
                solo = {g: error(tuple(h for h in gelus if h != g)) for g in gelus}
                ranked = sorted(gelus, key=lambda g: -solo[g])  # stable: ties in graph order
                lo, hi, hi_error = 0, len(gelus), 0.0  # err(lo) > bound >= err(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    e = error(_in_graph_order(ranked[:mid], gelus))
                    lo, hi, hi_error = (lo, mid, e) if e <= GELU_AUTO_MAX_REL else (mid, hi, hi_error)
                if hi < len(gelus):
                    exact_nodes = _in_graph_order(ranked[:hi], gelus)
                    chosen = dataclasses.replace(fast, gelu_exact_nodes=exact_nodes)
                    chosen_error = hi_error
    form = chosen.gelu if not exact_nodes else "mixed"
    record: dict[str, Any] = {
        "chosen": form,
        "max_rel_mnn_vs_exact": float(f"{worst:.4g}"),
        "bound": GELU_AUTO_MAX_REL,
    }
    if form == "mixed":
        record["exact_nodes"] = list(exact_nodes)
        record["fast_nodes"] = len(gelus) - len(exact_nodes)
        record["max_rel_chosen_vs_exact"] = float(f"{chosen_error:.4g}")
    return chosen, record


def _in_graph_order(names: list[str], order: list[str]) -> tuple[str, ...]:
    chosen = set(names)
    return tuple(g for g in order if g in chosen)
