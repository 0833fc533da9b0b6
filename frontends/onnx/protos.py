"""ONNX protobuf pieces as Kiln values: element types, tensors, attributes, value types.

Pure functions with no graph state, shared by the loader and the converters.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.errors import ConversionError
from compiler.ir.types import Dim, DType, TensorType

__all__ = [
    "dtype_of",
    "dtype_name",
    "tensor_to_array",
    "attribute_value",
    "node_attributes",
    "type_of_value_info",
    "is_symbol",
]

logger = logging.getLogger(__name__)


def dtype_name(code: int) -> str:
    """The ONNX name of an element type code, e.g. ``FLOAT8E4M3FN``."""
    try:
        return str(onnx.TensorProto.DataType.Name(code))
    except ValueError:
        return f"<type {code}>"


def dtype_of(code: int, where: str) -> DType:
    """The Kiln DType of an ONNX element type; ConversionError naming ``where`` if Kiln lacks it."""
    try:
        return DType(code)
    except ValueError:
        raise ConversionError(
            f"{where}: element type {dtype_name(code)} is not supported by the Kiln IR"
        ) from None


def tensor_to_array(tensor: onnx.TensorProto, where: str) -> np.ndarray:
    """A TensorProto as a numpy array in Kiln's storage convention (bfloat16 is refused)."""
    dtype_of(tensor.data_type, where)
    if tensor.data_type == onnx.TensorProto.BFLOAT16:
        raise ConversionError(f"{where}: bfloat16 constants are not supported by the Kiln IR")
    if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data:
        raise ConversionError(f"{where}: external data of tensor {tensor.name!r} was not loaded")
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as exc:  # noqa: BLE001 - any decoding problem is a broken tensor
        raise ConversionError(f"{where}: cannot decode tensor {tensor.name!r}: {exc}") from None
    if tensor.data_type == onnx.TensorProto.STRING:
        arr = np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(arr)
    return np.asarray(arr)


def attribute_value(attr: onnx.AttributeProto, where: str) -> Any:
    """An attribute as a Python value: ints, floats, str, tuples of those, numpy arrays or GraphProtos."""
    kind = attr.type
    a = onnx.AttributeProto
    if kind == a.INT:
        return int(attr.i)
    if kind == a.FLOAT:
        return float(attr.f)
    if kind == a.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if kind == a.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == a.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == a.STRINGS:
        return tuple(s.decode("utf-8", errors="replace") for s in attr.strings)
    if kind == a.TENSOR:
        return tensor_to_array(attr.t, f"{where} attribute {attr.name}")
    if kind == a.SPARSE_TENSOR:
        return sparse_to_array(attr.sparse_tensor, f"{where} attribute {attr.name}")
    if kind == a.GRAPH:
        return attr.g  # a subgraph: the control-flow converter imports it (frontends.onnx.subgraphs)
    if kind == a.GRAPHS:
        return tuple(attr.graphs)
    if kind == a.TENSORS:
        return tuple(tensor_to_array(t, f"{where} attribute {attr.name}") for t in attr.tensors)
    kind_name = a.AttributeType.Name(kind)
    raise ConversionError(f"{where}: attribute {attr.name!r} of kind {kind_name} is not supported")


def sparse_to_array(sparse: onnx.SparseTensorProto, where: str) -> np.ndarray:
    """A SparseTensorProto as a dense numpy array."""
    values = tensor_to_array(sparse.values, where)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    idx = tensor_to_array(sparse.indices, where).astype(np.int64)
    if idx.ndim == 1:  # linearized indices
        dense.reshape(-1)[idx] = values
    else:  # [NNZ, rank] coordinates
        dense[tuple(idx.T)] = values
    return dense


def node_attributes(node: onnx.NodeProto, where: str) -> dict[str, Any]:
    """All attributes of a node, by name, as Python values."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.ref_attr_name:
            raise ConversionError(f"{where}: attribute {attr.name!r} refers to a function attribute")
        out[attr.name] = attribute_value(attr, where)
    return out


def is_symbol(param: str) -> bool:
    """True if a dim_param is a usable symbol name (not empty or a placeholder like ``?``)."""
    return (
        bool(param)
        and (param[0].isalpha() or param[0] == "_")
        and all(c.isalnum() or c in "_.-:" for c in param)
    )


def type_of_value_info(vi: onnx.ValueInfoProto, where: str) -> TensorType:
    """The TensorType of a graph input; unknown dims get the symbol ``<name>_d<axis>``."""
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise ConversionError(
            f"{where}: {vi.name!r} is not a tensor ({t.WhichOneof('value')} values are not supported)"
        )
    tt = t.tensor_type
    dtype = dtype_of(tt.elem_type, f"{where} {vi.name!r}")
    if not tt.HasField("shape"):
        return TensorType(dtype, None)
    dims: list[Dim] = []
    for axis, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and is_symbol(d.dim_param):
            dims.append(d.dim_param)
        else:
            dims.append(f"{vi.name}_d{axis}")
    return TensorType(dtype, tuple(dims))
