"""Read an MNN ``.mnn`` file into a Kiln Graph.

The file is one ``MNN.Net`` FlatBuffer (``schemas/mnn/generated``). Layout ops
(``ConvertTensor``) are dropped: Kiln's graph is always in the logical NCHW order, which
is what MNN's op parameters (Concat/Softmax axes, Permute dims, Reshape with dimType
NCHW) describe. Convolutions come back as ``kiln::FusedConv`` (with the relu/relu6 flag)
with their weights decoded from whichever encoding the file uses (fp32, fp16, table-coded
int8/int4 symmetric or asymmetric, block-wise, fp16 scales, external ``.weight`` data). MNN's
own kernels that Kiln writes (LayerNorm, LSTM / RNN, ScatterNd, ...) are lifted back to the
ONNX-level ops they compute (``frontends.mnn.lifters_native``).
A file that cannot be read, whatever the reason, is one ModelFileError naming it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from compiler.errors import KilnError, ModelFileError
from compiler.ir.graph import Graph
from frontends.mnn import (  # noqa: F401  (registers the op lifters)
    lifters,
    lifters_converter,
    lifters_native,
    lifters_tfquant,
)
from frontends.mnn.reader import MnnReadError, Reader
from frontends.model_file import read_model_bytes
from schemas.mnn.external import check_side_file

__all__ = ["load_mnn", "MnnReadError"]

logger = logging.getLogger(__name__)


def load_mnn(
    source: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Import an MNN ``.mnn`` model (and its ``.weight`` side file) into a Kiln Graph.

    Raises:
        ModelFileError: missing, truncated or corrupt file; missing or short side file.
        UnsupportedOpsError: some op types have no Kiln mapping (all are listed).
        InputShapeError: ``input_shapes`` names an unknown input.
    """
    p, data = read_model_bytes(source)
    if len(data) < 8 or int.from_bytes(data[:4], "little") + 4 > len(data):
        raise ModelFileError(
            f"{p}: corrupt or truncated .mnn file ({len(data)} bytes; the root table lies outside)"
        )
    try:
        check_side_file(p, data)
        return Reader(p, data, input_shapes).read()
    except KilnError:
        raise
    except RecursionError:
        raise ModelFileError(f"{p}: corrupt .mnn file (nesting too deep)") from None
    except Exception as exc:  # flatbuffers, numpy and the verifier fail in many ways on bad bytes
        raise ModelFileError(f"{p}: corrupt or invalid .mnn file ({type(exc).__name__}: {exc})") from None
