"""The CANN emitter (``--emit cann``): writes ``model.om``.

graph -> :func:`lower_graph` (GE IR ops) -> ``ge`` or ``domi`` ModelDef + WEIGHTS_DATA
-> :func:`pack_om` (header, wide partition table, MODEL_DEF, WEIGHTS_DATA). Both
partitions are always present (WEIGHTS_DATA holds at least its 512 leading zero bytes),
which is what GE expects of a modern file and what Netron's table-width guess needs.
QDQ convs and Gemms that fuse-quantized-ops left in Q/DQ form (written in float) are logged and
listed with the pass's reasons in the artifact's details (``int8_fallbacks``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from backends.cann.domi_writer import write_domi
from backends.cann.ge_writer import write_ge
from backends.cann.lower import lower_graph
from backends.cann.lower_quant import qdq_fallbacks
from backends.cann.options import CannOptions, cann_options
from compiler.backend import Artifact
from compiler.ir.graph import Graph
from compiler.options import CompileOptions
from compiler.pattern import NearMiss
from schemas.cann.codes import MODEL_DEF, WEIGHTS_DATA
from schemas.cann.om_container import pack_om

__all__ = ["emit_cann", "om_bytes", "MODEL_FILE"]

MODEL_FILE = "model.om"

log = logging.getLogger(__name__)


def om_bytes(graph: Graph, options: CannOptions | None = None) -> bytes:
    """The complete .om file for ``graph`` (deterministic: equal graphs give equal bytes)."""
    opts = options or CannOptions()
    om = lower_graph(graph)
    model_def, weights = write_ge(om) if opts.schema == "ge" else write_domi(om)
    return pack_om([(MODEL_DEF, model_def), (WEIGHTS_DATA, weights)], name=graph.name)


def emit_cann(
    graph: Graph, out_dir: Path, options: CompileOptions, near_misses: Iterable[NearMiss] = ()
) -> list[Artifact]:
    """Write the legalized (fp32, or int8 with kiln::QConv/QGemm) graph as ``model.om`` into the
    output directory; ``near_misses`` are the legalization's (the reasons of int8 fallbacks)."""
    cann = cann_options(options)
    from passes.choose_layout import record_layouts

    (out_dir / MODEL_FILE).write_bytes(om_bytes(graph, cann))
    details: dict[str, object] = {"layout": "NC1HWC0", "layouts": record_layouts(graph, 16)}
    fallbacks = qdq_fallbacks(graph, near_misses)
    for name, why in fallbacks.items():
        log.warning("cann: QDQ %s stays in Q/DQ form and is written in float: %s", name, why)
    if fallbacks:
        details["int8_fallbacks"] = fallbacks
    target = f"ascend ({cann.schema})"
    return [Artifact("cann", target, MODEL_FILE, options.precision, details)]
