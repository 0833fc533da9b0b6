"""The CANN frontend's entry point: read an Ascend ``.om`` file into a Kiln Graph.

``load_om`` reads the bytes, checks the container as GE's loader does (magic, header
length = file size - 256, 1 to 8 partitions inside the file, back to back), decodes the
MODEL_DEF partition as ``ge.proto.ModelDef`` or, failing that, as the seed's
``domi.ModelDef``, and lifts the ops into a Graph (int8 ops back into QDQ form). A file
that cannot be read, whatever the reason, is one ModelFileError naming it and the fault.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from compiler.errors import ModelFileError
from compiler.ir.graph import Graph
from frontends.cann.domi_reader import parse_domi, read_domi
from frontends.cann.ge_reader import parse_ge, read_ge
from frontends.cann.lift import lift_graph
from frontends.model_file import read_model_bytes
from schemas.cann.codes import MODEL_DEF, WEIGHTS_DATA
from schemas.cann.om_container import read_om
from schemas.cann.om_graph import OmGraph

__all__ = ["load_om", "read_om_graph"]

logger = logging.getLogger(__name__)


def read_om_graph(data: bytes, source: str) -> tuple[str, OmGraph]:
    """(schema, OmGraph) of an .om file's bytes; schema is ``ge`` or ``domi``."""
    f = read_om(data, source)
    model_def = f.partitions[MODEL_DEF]
    weights = f.partitions.get(WEIGHTS_DATA)
    ge_model = parse_ge(model_def)
    if ge_model is not None:
        return "ge", read_ge(ge_model, weights, source)
    domi_model = parse_domi(model_def)
    if domi_model is not None:
        return "domi", read_domi(domi_model, weights, source)
    raise ModelFileError(
        f"{source}: corrupt .om model: MODEL_DEF is neither a ge.proto.ModelDef with a graph "
        "nor a domi.ModelDef with ops"
    )


def load_om(
    source: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Import an Ascend ``.om`` model into a Kiln Graph.

    Args:
        source: path of an .om file whose MODEL_DEF is a ge.proto or domi ModelDef.
        input_shapes: must equal the file's static input shapes when given.

    Raises:
        ModelFileError: missing, truncated, inconsistent or corrupt file.
        UnsupportedOpsError: some op types have no Kiln mapping (every one is listed).
        InputShapeError: ``input_shapes`` names an unknown input or another shape.
    """
    p, data = read_model_bytes(source)
    schema, om = read_om_graph(data, str(p))
    logger.info("%s: %s MODEL_DEF with %d ops", p, schema, len(om.ops))
    return lift_graph(om, str(p), input_shapes)
