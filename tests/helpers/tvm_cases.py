"""Many one-node op cases compiled by TVM as one graph (one compile for a whole table of cases).

Each :class:`OpCase` becomes one node of a shared Kiln graph, its inputs prefixed by the case name
(chosen ports as constants); :func:`compile_cases` runs the backend's legalization, lowers and
compiles it for a target, and :func:`run_cases` executes it on the host and returns every case's
outputs. :func:`ort_outputs` runs the same op in onnxruntime (tests.helpers.single_op).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Value
from compiler.ir.types import TensorType
from tests.helpers.single_op import run_ort

__all__ = ["OpCase", "case_graph", "compile_cases", "run_cases", "ort_outputs"]


@dataclass(frozen=True)
class OpCase:
    """One op application: ``inputs`` (None = absent), ``consts`` the ports made constants."""

    name: str
    op: str
    inputs: tuple[np.ndarray | None, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: frozenset[int] = frozenset()
    outputs: int = 1
    opset: int = 21


def case_graph(cases: Sequence[OpCase]) -> tuple[Graph, dict[str, np.ndarray], dict[str, list[str]]]:
    """The graph holding every case, its feeds, and each case's output names in order."""
    g = Graph("cases")
    feeds: dict[str, np.ndarray] = {}
    names: dict[str, list[str]] = {}
    outs: list[Value] = []
    for c in cases:
        vals: list[Value | None] = []
        for i, x in enumerate(c.inputs):
            if x is None:
                vals.append(None)
            elif i in c.consts:
                vals.append(g.add_constant(x, f"{c.name}_c{i}"))
            else:
                vals.append(g.add_input(f"{c.name}_in{i}", TensorType.of(x)))
                feeds[f"{c.name}_in{i}"] = x
        node = g.add_node(c.op, vals, c.attrs, num_outputs=c.outputs, name=c.name)
        values = g.outputs_of(node)
        outs.extend(values)
        names[c.name] = [v.name for v in values]
    g.set_outputs(outs)
    return g, feeds, names


def compile_cases(cases: Sequence[OpCase], target: str = "cpu") -> tuple[Any, Graph, dict[str, np.ndarray]]:
    """(TVM executable, the legalized graph, feeds) of the cases compiled for ``target``."""
    from backends.tvm.build import compile_module
    from backends.tvm.emit import prepare_graph
    from backends.tvm.lower import lower_graph
    from backends.tvm.target import resolve_target

    g, feeds, _ = case_graph(cases)
    spec = resolve_target(target)
    legal, _ = prepare_graph(g, spec)
    return compile_module(lower_graph(legal, spec).mod, spec), legal, feeds


def run_cases(cases: Sequence[OpCase]) -> dict[str, list[np.ndarray]]:
    """Every case's outputs from one host (``cpu``) compile, by case name."""
    import tvm
    from tvm import relax

    ex, legal, feeds = compile_cases(cases)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(feeds[v.name], tvm.cpu()) for v in legal.inputs])
    flat = [res] if len(legal.outputs) == 1 else [res[i] for i in range(len(legal.outputs))]
    by_name = {n: a.numpy() for n, a in zip(legal.output_names, flat, strict=True)}
    _, _, names = case_graph(cases)
    return {c.name: [by_name[n] for n in names[c.name]] for c in cases}


def ort_outputs(case: OpCase) -> list[np.ndarray]:
    """The case run by onnxruntime (every input a graph input)."""
    return run_ort(case.op, list(case.inputs), case.attrs, num_outputs=case.outputs, opset=case.opset)
