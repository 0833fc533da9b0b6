"""How GE IR ops are spelled in the seed's ``domi.ModelDef`` (``--cann-schema domi``), as data.

The seed schema predates the GE IR: op types are the 2018 domi OMG names (Convolution,
Pooling, FullConnection, BatchNorm, ReLU, Softmax, Permute, ...) and some ops carry typed
parameter messages (``ConvolutionOpParams`` ...) that hold their weights as ``WeightDef``.
``DOMI_TYPE`` renames GE types (ops not listed keep their GE type name; their attributes
go to ``OpDef.attr`` under their GE names). ``ABSORBED`` lists, per GE type, the input
ports whose constants move into the typed parameters (their ``src_name`` is then empty).
The byte formats Kiln chose for the quantization fields are in schemas/cann/README.md.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = [
    "DOMI_TYPE",
    "GE_TYPE",
    "ACTIVATION_MODE",
    "MODE_ACTIVATION",
    "ELTWISE_MODE",
    "MODE_ELTWISE",
    "ABSORBED",
    "INLINE_LIMIT",
    "CONV_PARAM_ATTRS",
    "POOL_PARAM_ATTRS",
]

DOMI_TYPE = MappingProxyType(
    {
        "Conv2D": "Convolution",
        "FullyConnection": "FullConnection",
        "Pooling": "Pooling",
        "BNInference": "BatchNorm",
        "SoftmaxV2": "Softmax",
        "Reshape": "Reshape",
        "ConcatD": "Concat",
        "TransposeD": "Permute",
        "Relu": "ReLU",
        "Sigmoid": "Sigmoid",
        "Tanh": "TanH",
        "Relu6": "ReLU6",
        "LeakyRelu": "Activation",
        "AscendQuant": "Quant",
        "AscendDequant": "DeQuant",
        "AscendAntiQuant": "AntiQuant",
    }
)
GE_TYPE = MappingProxyType({v: k for k, v in DOMI_TYPE.items()})

# domi activation modes (ActivationOpParams.mode): SIGMOID 0, RELU 1, TANH 2, CLIPPED_RELU 3, LEAKY_RELU 5.
ACTIVATION_MODE = MappingProxyType({"Sigmoid": 0, "Relu": 1, "Tanh": 2, "Relu6": 3, "LeakyRelu": 5})
MODE_ACTIVATION = MappingProxyType({v: k for k, v in ACTIVATION_MODE.items()})

# domi eltwise modes (EltwiseOpParams.mode): PROD 0, SUM 1, MAX 2. Used for Add/Mul/Maximum of
# two same-shaped non-constant inputs; other binary ops keep their GE type.
ELTWISE_MODE = MappingProxyType({"Mul": 0, "Add": 1, "Maximum": 2})
MODE_ELTWISE = MappingProxyType({v: k for k, v in ELTWISE_MODE.items()})

# GE type -> {input port: typed-parameter field holding that input's constant}.
ABSORBED = MappingProxyType(
    {
        "Conv2D": MappingProxyType({1: "filter", 2: "bias"}),
        "FullyConnection": MappingProxyType({1: "filter", 2: "bias"}),
        "BNInference": MappingProxyType(
            {
                1: "estimated_mean",
                2: "estimated_variance",
                3: "moving_average_fraction",
                4: "scale",
                5: "bias",
            }
        ),
        "Reshape": MappingProxyType({1: "shape"}),
        "AscendDequant": MappingProxyType({1: "dequantize_param"}),
    }
)

# Constants of at most this many bytes are written inline (WeightDef.data); larger ones go to
# WEIGHTS_DATA (WeightDef.data_offset, 512-byte aligned).
INLINE_LIMIT = 64

# GE attributes that ConvolutionOpParams / PoolingOpParams carry (the rest stay in OpDef.attr).
CONV_PARAM_ATTRS = frozenset({"strides", "pads", "dilations", "groups"})
POOL_PARAM_ATTRS = frozenset({"mode", "global_pooling", "window", "stride", "pad", "ceil_mode"})
