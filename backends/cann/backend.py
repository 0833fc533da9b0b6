"""The CANN backend (``--emit cann``): ``model.om`` for Ascend NPUs, as one :class:`Backend`.

Its op table is :func:`backends.cann.lower.capabilities` (``SIMPLE_OPS`` one-to-one ops and
the coded lowerings, one shape), its legalization the ``legalize-cann`` pipeline, its own
flag ``--cann-schema`` (:class:`CannOptions`), and its runtime Kiln's ``.om`` reader plus
onnxruntime (:func:`backends.cann.runtime.run_om`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.cann.options import SCHEMAS, CannOptions
from compiler.backend import Artifact, BackendBase, CapabilityTable
from compiler.errors import OptionError

if TYPE_CHECKING:
    from backends.cann.lower import LowerFn
    from compiler.ir.graph import Graph
    from compiler.pass_infra import PassContext

__all__ = ["BACKEND", "CannBackend"]


@dataclass
class CannBackend(BackendBase):
    """``--emit cann``: one target, ``cann``; the schema of MODEL_DEF is its option."""

    def capabilities(self, target: str) -> CapabilityTable[LowerFn]:
        """The CANN op table (one for every target)."""
        from backends.cann.lower import capabilities

        return capabilities()

    def emit(self, graph: Graph, out_dir: Path, ctx: PassContext, target: str) -> list[Artifact]:
        """Write ``model.om`` (see :func:`backends.cann.emit.emit_cann`)."""
        from backends.cann.emit import emit_cann

        return emit_cann(graph, out_dir, ctx.options, ctx.near_misses)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """``--cann-schema``."""
        g = parser.add_argument_group("CANN (--emit cann)")
        g.add_argument(
            "--cann-schema",
            choices=list(SCHEMAS),
            help="MODEL_DEF schema of model.om: ge (ge.proto.ModelDef, default) "
            "or domi (the legacy seed schema)",
        )

    def options_from_args(self, args: argparse.Namespace, requested: bool) -> CannOptions | None:
        """:class:`CannOptions` when ``--emit cann`` was asked for; otherwise --cann-schema is refused."""
        schema = getattr(args, "cann_schema", None)
        if not requested:
            if schema is not None:
                raise OptionError("--cann-schema needs --emit cann")
            return None
        return CannOptions(schema=schema or "ge")


BACKEND = CannBackend(
    name="cann",
    flag="--emit",
    options_type=CannOptions,
    runtime=(".om", "backends.cann.runtime:run_om"),
    legalization_pipeline="legalize-cann",
)
