"""The op x backend support matrix behind ``kiln ops``, generated from the backends' tables.

For every op in the registry and every backend: ``native`` when the backend's
:class:`~compiler.backend.CapabilityTable` has an entry (its check may still refuse some
attribute or shape combinations, which the preflight reports per node); ``decomposed`` when
the decomposition library rewrites the op into ops the backend has (the rules are named); else
``refused``, with the reason. The README's copy of the matrix is this module's Markdown output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Support",
    "SupportMatrix",
    "support_matrix",
    "format_text",
    "format_markdown",
    "update_readme",
    "BACKEND_TARGETS",
]

# the table each backend is shown with in the matrix: TVM's is the same for cpu, arm and cuda
BACKEND_TARGETS: dict[str, str] = {"tvm": "cpu"}


@dataclass(frozen=True)
class Support:
    """How one backend handles one op."""

    status: str  # native | decomposed | refused
    detail: str = ""  # the decomposition rules used, or the reason of a refusal

    def cell(self) -> str:
        """A short table cell."""
        if self.status == "native":
            return "native"
        if self.status == "decomposed":
            return f"decomposed ({self.detail})"
        return "-"


@dataclass
class SupportMatrix:
    """``rows[op][backend]`` for every registered op (qualified name) and backend."""

    backends: list[str]
    rows: dict[str, dict[str, Support]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """``{op: {backend: {status, detail}}}``."""
        return {
            op: {b: {"status": s.status, "detail": s.detail} for b, s in cells.items()}
            for op, cells in self.rows.items()
        }

    def counts(self) -> dict[str, dict[str, int]]:
        """Per backend, how many ops are native, decomposed and refused."""
        out = {b: {"native": 0, "decomposed": 0, "refused": 0} for b in self.backends}
        for cells in self.rows.values():
            for b, s in cells.items():
                out[b][s.status] += 1
        return out


def _internal(qualified: str) -> bool:
    return qualified in ("Input", "Constant")


def support_matrix(backends: Sequence[str] | None = None) -> SupportMatrix:
    """The matrix for ``backends`` (default: every registered backend), from their tables."""
    from compiler.backend import all_backends, get_backend
    from compiler.ops.registry import all_ops
    from passes.decompositions import decomposed_support

    chosen = [get_backend(n) for n in backends] if backends else all_backends()
    tables = {b.name: b.capabilities(BACKEND_TARGETS.get(b.name, b.name)) for b in chosen}
    matrix = SupportMatrix([b.name for b in chosen])
    for opdef in sorted(all_ops(), key=lambda d: d.qualified):
        op = opdef.qualified
        if _internal(op):
            continue
        cells: dict[str, Support] = {}
        for name, table in tables.items():
            if op in table:
                cells[name] = Support("native")
                continue
            via = decomposed_support(table, op)
            if isinstance(via, str):
                why = f"no {name} lowering" + (f"; {via}" if via else "")
                cells[name] = Support("refused", why)
            else:
                cells[name] = Support("decomposed", ", ".join(r.name for r in via))
        matrix.rows[op] = cells
    return matrix


def format_text(matrix: SupportMatrix) -> str:
    """Aligned columns with a per-backend count line."""
    width = max(len(op) for op in matrix.rows) + 2
    cols = [max(12, len(b) + 2) for b in matrix.backends]
    head = "op".ljust(width) + "".join(b.ljust(c) for b, c in zip(matrix.backends, cols, strict=True))
    lines = [head]
    for op, cells in matrix.rows.items():
        marks = {"native": "native", "decomposed": "decomposed", "refused": "-"}
        row = "".join(marks[cells[b].status].ljust(c) for b, c in zip(matrix.backends, cols, strict=True))
        lines.append(op.ljust(width) + row)
    counts = matrix.counts()
    lines.append("")
    for b in matrix.backends:
        c = counts[b]
        lines.append(f"{b}: {c['native']} native, {c['decomposed']} decomposed, {c['refused']} refused")
    return "\n".join(lines)


def format_markdown(matrix: SupportMatrix) -> str:
    """A Markdown table (the README's copy); decomposed cells name their rules."""
    lines = ["| op | " + " | ".join(matrix.backends) + " |", "|---|" + "---|" * len(matrix.backends)]
    for op, cells in matrix.rows.items():
        lines.append(f"| `{op}` | " + " | ".join(cells[b].cell() for b in matrix.backends) + " |")
    counts = matrix.counts()
    summary = "; ".join(
        f"{b}: {c['native']} native, {c['decomposed']} decomposed, {c['refused']} refused"
        for b, c in ((b, counts[b]) for b in matrix.backends)
    )
    return "\n".join(lines) + f"\n\n{summary}."


def update_readme(path: str = "README.md") -> bool:
    """Rewrite the matrix between the README's ``kiln ops`` markers; True if it changed."""
    from pathlib import Path

    begin, end = "<!-- kiln ops: begin -->", "<!-- kiln ops: end -->"
    p = Path(path)
    text = p.read_text()
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{format_markdown(support_matrix())}\n{end}{tail}"
    if new != text:
        p.write_text(new)
    return new != text


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--update-readme"]:
        print("README.md updated" if update_readme() else "README.md already fresh")
    else:
        print(format_text(support_matrix()))
