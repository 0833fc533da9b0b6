"""The ONNX frontend's entry point: read a model file (or proto) into a Kiln Graph.

``load_onnx`` reads the file (external data relative to it), checks that it is
an ONNX model Kiln can read (IR version >= 3, a default-domain opset >= 9),
inlines model-local functions and hands the proto to :class:`OnnxImporter`.
Every failure is a :class:`compiler.errors.KilnError` naming the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import onnx.inliner
import onnx.version_converter
from google.protobuf.message import DecodeError

from compiler.errors import ModelFileError
from compiler.ir.graph import Graph
from frontends.onnx.functions import expand_functions
from frontends.onnx.importer import MIN_OPSET, OnnxImporter

__all__ = ["load_onnx", "read_onnx_model", "MIN_IR_VERSION", "MAX_IR_VERSION"]

logger = logging.getLogger(__name__)

MIN_IR_VERSION = 3
MAX_IR_VERSION = 10
"""IR versions Kiln is tested with; newer ones load (logged at INFO)."""


def read_onnx_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse a model file, loading external data relative to it; ModelFileError on failure."""
    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"{p}: model file not found")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError, TypeError, onnx.checker.ValidationError) as exc:
        raise ModelFileError(f"{p}: not a readable ONNX model (corrupt or truncated file: {exc})") from None
    _check_model_proto(model, str(p))
    try:
        onnx.load_external_data_for_model(model, str(p.parent))
    except Exception as exc:  # noqa: BLE001 - OSError, onnx.checker.ValidationError, ...
        raise ModelFileError(f"{p}: cannot load the model's external data ({exc})") from None
    return model


def _check_model_proto(model: onnx.ModelProto, source: str) -> None:
    if not isinstance(model, onnx.ModelProto):
        raise ModelFileError(f"{source}: expected an onnx.ModelProto, got {type(model).__name__}")
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise ModelFileError(f"{source}: not an ONNX model (no IR version, graph or opset import)")
    if model.ir_version < MIN_IR_VERSION:
        raise ModelFileError(f"{source}: ONNX IR version {model.ir_version} is older than {MIN_IR_VERSION}")
    if model.ir_version > MAX_IR_VERSION:
        logger.info(
            "%s: ONNX IR version %d is newer than %d; importing anyway",
            source,
            model.ir_version,
            MAX_IR_VERSION,
        )


def load_onnx(
    source: str | os.PathLike[str] | onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> Graph:
    """Import an ONNX model into a Kiln Graph.

    Args:
        source: a path to a ``.onnx`` file, or an in-memory ModelProto.
        input_shapes: fixed shapes for named graph inputs (dynamic dims only).

    Returns:
        The graph, with value, node and graph input/output names of the source model.

    Raises:
        ModelFileError: the file is missing, unreadable or not an ONNX model.
        UnsupportedOpsError: some ops have no converter (every one is listed).
        InputShapeError: ``input_shapes`` names an unknown input or contradicts the model.
        ConversionError: a node could not be converted (names the node and op).
    """
    if isinstance(source, onnx.ModelProto):
        name = source.graph.name or "<model>"
        _check_model_proto(source, name)
        model = source
    else:
        name = str(source)
        model = read_onnx_model(source)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    model = expand_functions(_upgraded(model, name), name)
    return OnnxImporter(model, name, input_shapes or {}).run()


def _upgraded(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """``model`` raised to default-domain opset :data:`MIN_OPSET` by onnx.version_converter when it
    is older (unchanged when it is not, or when the converter fails: the importer then refuses it)."""
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= MIN_OPSET:
        return model
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # noqa: BLE001 - any converter failure: the importer's refusal stands
        logger.info("%s: onnx.version_converter cannot raise opset %d: %s", source, opset, exc)
        return model
    if _signature(upgraded) != _signature(model):  # Scan-8 -> 9 drops the batch axis: not the same model
        logger.info("%s: onnx.version_converter changes the graph's inputs or outputs; not used", source)
        return model
    logger.info("%s: opset %d raised to %d by onnx.version_converter", source, opset, MIN_OPSET)
    return upgraded


def _signature(model: onnx.ModelProto) -> list[bytes]:
    g = model.graph
    return [vi.SerializeToString(deterministic=True) for vi in (*g.input, *g.output)]
