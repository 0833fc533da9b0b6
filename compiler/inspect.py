"""``kiln inspect``: a summary of a model's interface, ops and parameters."""

from __future__ import annotations

from collections import Counter

from compiler.ir.graph import CONSTANT_OP, Graph

__all__ = ["summarize", "op_histogram"]


def op_histogram(graph: Graph) -> dict[str, int]:
    """Op counts (constants and inputs excluded), most frequent first, then by name."""
    c = Counter(n.qualified_op for n in graph.ops())
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize(graph: Graph, title: str) -> str:
    """Human-readable summary text."""
    lines = [f"model: {title}", "inputs:"]
    lines += [f"  {v.name}: {v.type}" for v in graph.inputs]
    lines.append("outputs:")
    lines += [f"  {v.name}: {v.type}" for v in graph.outputs]
    consts = [n for n in graph.nodes() if n.op == CONSTANT_OP and not n.domain]
    params = sum(int(n.attrs.value.size) for n in consts)
    nbytes = sum(int(n.attrs.value.nbytes) for n in consts)
    lines.append(f"parameters: {params:,} ({nbytes:,} bytes in {len(consts)} constants)")
    lines.append("ops:")
    lines += [f"  {op:<24} {n}" for op, n in op_histogram(graph).items()]
    return "\n".join(lines)
