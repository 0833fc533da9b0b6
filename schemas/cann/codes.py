"""The numeric codes of the .om format: three data-type enums, formats, partitions.

A CANN file uses three different data-type numberings, and mixing them is the classic
bug (see ../shared/reference/cann/NOTES.md §3.1):

* ``ge.proto.DataType`` (``TensorDescriptor.dtype`` in ``ge_ir.proto``);
* the C++ ``ge::DataType`` (int attributes such as AscendQuant's ``dst_type`` or
  AscendDequant's ``dtype``, and the ``dt`` attribute kind);
* the domi/cce ``domiDataType_t`` (the seed's ``int32 data_type`` fields).

Formats: descriptors carry the name (``layout = "NCHW"``), and ``format_for_int`` attrs
the C++ ``ge::Format`` value; the seed's ``int32 format`` uses the domi values, which
agree with ``ge::Format`` for 0..8 only (Kiln writes 0..3).
"""

from __future__ import annotations

from types import MappingProxyType

from compiler.ir.types import DType

__all__ = [
    "PROTO_DTYPE",
    "CPP_DTYPE",
    "DOMI_DTYPE",
    "FORMAT_CODES",
    "DOMI_FORMAT_CODES",
    "PARTITION_NAMES",
    "MODEL_DEF",
    "WEIGHTS_DATA",
    "dtype_from",
    "format_for",
]

# Kiln DType -> ge.proto.DataType (TensorDescriptor.dtype).
PROTO_DTYPE = MappingProxyType(
    {
        DType.FLOAT32: 1,
        DType.FLOAT16: 2,
        DType.INT8: 3,
        DType.UINT8: 4,
        DType.INT16: 5,
        DType.UINT16: 6,
        DType.INT32: 7,
        DType.INT64: 8,
        DType.UINT32: 9,
        DType.UINT64: 10,
        DType.BOOL: 11,
        DType.FLOAT64: 12,
        DType.BFLOAT16: 27,
    }
)

# Kiln DType -> C++ ge::DataType (int attributes; value 5 is reserved there).
CPP_DTYPE = MappingProxyType(
    {
        DType.FLOAT32: 0,
        DType.FLOAT16: 1,
        DType.INT8: 2,
        DType.INT32: 3,
        DType.UINT8: 4,
        DType.INT16: 6,
        DType.UINT16: 7,
        DType.UINT32: 8,
        DType.INT64: 9,
        DType.UINT64: 10,
        DType.FLOAT64: 11,
        DType.BOOL: 12,
        DType.BFLOAT16: 27,
    }
)

# Kiln DType -> domi/cce data type (the seed's int32 data_type fields; no bf16 there).
DOMI_DTYPE = MappingProxyType(
    {
        DType.FLOAT32: 0,
        DType.FLOAT16: 1,
        DType.INT8: 2,
        DType.INT32: 3,
        DType.UINT8: 4,
        DType.INT16: 6,
        DType.UINT16: 7,
        DType.UINT32: 8,
        DType.INT64: 9,
        DType.UINT64: 10,
        DType.FLOAT64: 11,
        DType.BOOL: 12,
    }
)

# Format name -> C++ ge::Format value (the descriptor's layout string is the name).
FORMAT_CODES = MappingProxyType(
    {
        "NCHW": 0,
        "NHWC": 1,
        "ND": 2,
        "NC1HWC0": 3,
        "FRACTAL_Z": 4,
        "NC1HWC0_C04": 12,
        "FRACTAL_Z_C04": 13,
        "CHWN": 14,
        "HWCN": 16,
        "NDHWC": 27,
        "FRACTAL_NZ": 29,
        "NCDHW": 30,
        "NDC1HWC0": 32,
        "FRACTAL_Z_3D": 33,
        "NC": 35,
    }
)

# Format name -> domi int32 format (agrees with ge::Format for 0..8).
DOMI_FORMAT_CODES = MappingProxyType({"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4})

# ModelPartitionType values.
MODEL_DEF = 0
WEIGHTS_DATA = 1
PARTITION_NAMES = MappingProxyType(
    {
        0: "MODEL_DEF",
        1: "WEIGHTS_DATA",
        2: "TASK_INFO",
        3: "TBE_KERNELS",
        4: "CUST_AICPU_KERNELS",
        5: "SO_BINS",
        6: "FLOW_MODEL",
        7: "FLOW_SUBMODEL",
        8: "MODEL_INOUT_INFO",
        9: "STATIC_TASK_DESC",
        10: "DYNAMIC_TASK_DESC",
        11: "TASK_PARAM",
        12: "TILING_DATA",
        20: "PRE_MODEL_DESC",
        21: "PRE_MODEL_SQE",
        22: "PRE_KERNEL_ARGS",
        23: "PRE_MODEL_DESC_EXTEND",
        24: "BUNDLE_MODEL_INFO",
        25: "BUNDLE_MODEL_VAR_INFO",
        26: "CUSTOM_OPS",
    }
)


def dtype_from(table: MappingProxyType[DType, int], code: int) -> DType | None:
    """The Kiln DType whose code in ``table`` is ``code`` (None if it has none)."""
    for dt, c in table.items():
        if c == code:
            return dt
    return None


def format_for(rank: int | None) -> str:
    """The origin format Kiln writes for a tensor of this rank: NCHW for 4-D, else ND."""
    return "NCHW" if rank == 4 else "ND"
