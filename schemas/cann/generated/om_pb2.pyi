from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TargetType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MINI: _ClassVar[TargetType]
    TINY: _ClassVar[TargetType]
    LITE: _ClassVar[TargetType]

class QuantizeScaleType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VECTOR_SCALE: _ClassVar[QuantizeScaleType]
    SCALAR_SCALE: _ClassVar[QuantizeScaleType]

class QuantizeScaleMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORMAL_MODE: _ClassVar[QuantizeScaleMode]
    SQRT_MODE: _ClassVar[QuantizeScaleMode]

class QuantizeAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NON_OFFSET_ALGO: _ClassVar[QuantizeAlgorithm]
    HALF_OFFSET_ALGO: _ClassVar[QuantizeAlgorithm]
    ALL_OFFSET_ALGO: _ClassVar[QuantizeAlgorithm]

class DeviceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NPU: _ClassVar[DeviceType]
    CPU: _ClassVar[DeviceType]
MINI: TargetType
TINY: TargetType
LITE: TargetType
VECTOR_SCALE: QuantizeScaleType
SCALAR_SCALE: QuantizeScaleType
NORMAL_MODE: QuantizeScaleMode
SQRT_MODE: QuantizeScaleMode
NON_OFFSET_ALGO: QuantizeAlgorithm
HALF_OFFSET_ALGO: QuantizeAlgorithm
ALL_OFFSET_ALGO: QuantizeAlgorithm
NPU: DeviceType
CPU: DeviceType

class ModelDef(_message.Message):
    __slots__ = ("name", "version", "memory_size", "stream_num", "event_num", "weight_size", "label_num", "op", "target_type", "attr")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrDef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrDef, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    STREAM_NUM_FIELD_NUMBER: _ClassVar[int]
    EVENT_NUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SIZE_FIELD_NUMBER: _ClassVar[int]
    LABEL_NUM_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    TARGET_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    memory_size: int
    stream_num: int
    event_num: int
    weight_size: int
    label_num: int
    op: _containers.RepeatedCompositeFieldContainer[OpDef]
    target_type: TargetType
    attr: _containers.MessageMap[str, AttrDef]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., memory_size: _Optional[int] = ..., stream_num: _Optional[int] = ..., event_num: _Optional[int] = ..., weight_size: _Optional[int] = ..., label_num: _Optional[int] = ..., op: _Optional[_Iterable[_Union[OpDef, _Mapping]]] = ..., target_type: _Optional[_Union[TargetType, str]] = ..., attr: _Optional[_Mapping[str, AttrDef]] = ...) -> None: ...

class OpDef(_message.Message):
    __slots__ = ("name", "type", "id", "stream_id", "input_name", "src_name", "src_index", "input", "output", "input_desc", "output_desc", "weights", "dst_name", "dst_index", "workspace", "workspace_bytes", "weight_name", "is_input_const", "attr", "quantize_factor", "sender_param", "receiver_param", "convolution_param", "pooling_param", "eltwise_param", "batchnorm_param", "scale_param", "full_connection_param", "softmax_param", "activation_param", "reshape_param")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrDef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrDef, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_NAME_FIELD_NUMBER: _ClassVar[int]
    SRC_NAME_FIELD_NUMBER: _ClassVar[int]
    SRC_INDEX_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_DESC_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DESC_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DST_NAME_FIELD_NUMBER: _ClassVar[int]
    DST_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_NAME_FIELD_NUMBER: _ClassVar[int]
    IS_INPUT_CONST_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    QUANTIZE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    SENDER_PARAM_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONVOLUTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    ELTWISE_PARAM_FIELD_NUMBER: _ClassVar[int]
    BATCHNORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    SCALE_PARAM_FIELD_NUMBER: _ClassVar[int]
    FULL_CONNECTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_PARAM_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_PARAM_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_PARAM_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    id: int
    stream_id: int
    input_name: _containers.RepeatedScalarFieldContainer[str]
    src_name: _containers.RepeatedScalarFieldContainer[str]
    src_index: _containers.RepeatedScalarFieldContainer[int]
    input: _containers.RepeatedScalarFieldContainer[int]
    output: _containers.RepeatedScalarFieldContainer[int]
    input_desc: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    output_desc: _containers.RepeatedCompositeFieldContainer[TensorDescriptor]
    weights: _containers.RepeatedCompositeFieldContainer[WeightDef]
    dst_name: _containers.RepeatedScalarFieldContainer[str]
    dst_index: _containers.RepeatedScalarFieldContainer[int]
    workspace: _containers.RepeatedScalarFieldContainer[int]
    workspace_bytes: _containers.RepeatedScalarFieldContainer[int]
    weight_name: _containers.RepeatedScalarFieldContainer[str]
    is_input_const: _containers.RepeatedScalarFieldContainer[bool]
    attr: _containers.MessageMap[str, AttrDef]
    quantize_factor: QuantizeFactorParams
    sender_param: SendOpParams
    receiver_param: RecvOpParams
    convolution_param: ConvolutionOpParams
    pooling_param: PoolingOpParams
    eltwise_param: EltwiseOpParams
    batchnorm_param: BatchNormOpParams
    scale_param: ScaleOpParams
    full_connection_param: FullConnectionOpParams
    softmax_param: SoftmaxOpParams
    activation_param: ActivationOpParams
    reshape_param: ReshapeOpParams
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., id: _Optional[int] = ..., stream_id: _Optional[int] = ..., input_name: _Optional[_Iterable[str]] = ..., src_name: _Optional[_Iterable[str]] = ..., src_index: _Optional[_Iterable[int]] = ..., input: _Optional[_Iterable[int]] = ..., output: _Optional[_Iterable[int]] = ..., input_desc: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., output_desc: _Optional[_Iterable[_Union[TensorDescriptor, _Mapping]]] = ..., weights: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ..., dst_name: _Optional[_Iterable[str]] = ..., dst_index: _Optional[_Iterable[int]] = ..., workspace: _Optional[_Iterable[int]] = ..., workspace_bytes: _Optional[_Iterable[int]] = ..., weight_name: _Optional[_Iterable[str]] = ..., is_input_const: _Optional[_Iterable[bool]] = ..., attr: _Optional[_Mapping[str, AttrDef]] = ..., quantize_factor: _Optional[_Union[QuantizeFactorParams, _Mapping]] = ..., sender_param: _Optional[_Union[SendOpParams, _Mapping]] = ..., receiver_param: _Optional[_Union[RecvOpParams, _Mapping]] = ..., convolution_param: _Optional[_Union[ConvolutionOpParams, _Mapping]] = ..., pooling_param: _Optional[_Union[PoolingOpParams, _Mapping]] = ..., eltwise_param: _Optional[_Union[EltwiseOpParams, _Mapping]] = ..., batchnorm_param: _Optional[_Union[BatchNormOpParams, _Mapping]] = ..., scale_param: _Optional[_Union[ScaleOpParams, _Mapping]] = ..., full_connection_param: _Optional[_Union[FullConnectionOpParams, _Mapping]] = ..., softmax_param: _Optional[_Union[SoftmaxOpParams, _Mapping]] = ..., activation_param: _Optional[_Union[ActivationOpParams, _Mapping]] = ..., reshape_param: _Optional[_Union[ReshapeOpParams, _Mapping]] = ...) -> None: ...

class SendOpParams(_message.Message):
    __slots__ = ("event_id",)
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    def __init__(self, event_id: _Optional[int] = ...) -> None: ...

class RecvOpParams(_message.Message):
    __slots__ = ("event_id",)
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    def __init__(self, event_id: _Optional[int] = ...) -> None: ...

class QuantizeFactor(_message.Message):
    __slots__ = ("scale_mode", "scale_value", "scale_offset", "offset_data_value", "offset_data_offset", "offset_weight_value", "offset_weight_offset", "offset_pad_value", "offset_pad_offset")
    SCALE_MODE_FIELD_NUMBER: _ClassVar[int]
    SCALE_VALUE_FIELD_NUMBER: _ClassVar[int]
    SCALE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_DATA_VALUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_WEIGHT_VALUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_WEIGHT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_PAD_VALUE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_PAD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    scale_mode: QuantizeScaleMode
    scale_value: bytes
    scale_offset: int
    offset_data_value: bytes
    offset_data_offset: int
    offset_weight_value: bytes
    offset_weight_offset: int
    offset_pad_value: bytes
    offset_pad_offset: int
    def __init__(self, scale_mode: _Optional[_Union[QuantizeScaleMode, str]] = ..., scale_value: _Optional[bytes] = ..., scale_offset: _Optional[int] = ..., offset_data_value: _Optional[bytes] = ..., offset_data_offset: _Optional[int] = ..., offset_weight_value: _Optional[bytes] = ..., offset_weight_offset: _Optional[int] = ..., offset_pad_value: _Optional[bytes] = ..., offset_pad_offset: _Optional[int] = ...) -> None: ...

class QuantizeCalcFactor(_message.Message):
    __slots__ = ("offsetw", "offsetw_offset", "offsetd", "offsetd_offset", "scalereq", "scaledreq_offset", "offsetdnext", "offsetdnext_offset")
    OFFSETW_FIELD_NUMBER: _ClassVar[int]
    OFFSETW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETD_FIELD_NUMBER: _ClassVar[int]
    OFFSETD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SCALEREQ_FIELD_NUMBER: _ClassVar[int]
    SCALEDREQ_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETDNEXT_FIELD_NUMBER: _ClassVar[int]
    OFFSETDNEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    offsetw: bytes
    offsetw_offset: int
    offsetd: bytes
    offsetd_offset: int
    scalereq: bytes
    scaledreq_offset: int
    offsetdnext: bytes
    offsetdnext_offset: int
    def __init__(self, offsetw: _Optional[bytes] = ..., offsetw_offset: _Optional[int] = ..., offsetd: _Optional[bytes] = ..., offsetd_offset: _Optional[int] = ..., scalereq: _Optional[bytes] = ..., scaledreq_offset: _Optional[int] = ..., offsetdnext: _Optional[bytes] = ..., offsetdnext_offset: _Optional[int] = ...) -> None: ...

class QuantizeFactorParams(_message.Message):
    __slots__ = ("quantize_algo", "scale_type", "quantize_param", "dequantize_param", "requantize_param", "quantizecalc_param")
    QUANTIZE_ALGO_FIELD_NUMBER: _ClassVar[int]
    SCALE_TYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    DEQUANTIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    REQUANTIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    QUANTIZECALC_PARAM_FIELD_NUMBER: _ClassVar[int]
    quantize_algo: QuantizeAlgorithm
    scale_type: QuantizeScaleType
    quantize_param: QuantizeFactor
    dequantize_param: QuantizeFactor
    requantize_param: QuantizeFactor
    quantizecalc_param: QuantizeCalcFactor
    def __init__(self, quantize_algo: _Optional[_Union[QuantizeAlgorithm, str]] = ..., scale_type: _Optional[_Union[QuantizeScaleType, str]] = ..., quantize_param: _Optional[_Union[QuantizeFactor, _Mapping]] = ..., dequantize_param: _Optional[_Union[QuantizeFactor, _Mapping]] = ..., requantize_param: _Optional[_Union[QuantizeFactor, _Mapping]] = ..., quantizecalc_param: _Optional[_Union[QuantizeCalcFactor, _Mapping]] = ...) -> None: ...

class ConvolutionOpParams(_message.Message):
    __slots__ = ("mode", "algo", "pad_mode", "group", "num_output", "pad", "stride", "dilation", "kernel", "alpha", "beta", "filter", "bias", "relu_flag", "adj", "target_shape", "before_pad")
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALGO_FIELD_NUMBER: _ClassVar[int]
    PAD_MODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    DILATION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    RELU_FLAG_FIELD_NUMBER: _ClassVar[int]
    ADJ_FIELD_NUMBER: _ClassVar[int]
    TARGET_SHAPE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_PAD_FIELD_NUMBER: _ClassVar[int]
    mode: int
    algo: int
    pad_mode: int
    group: int
    num_output: int
    pad: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    dilation: _containers.RepeatedScalarFieldContainer[int]
    kernel: _containers.RepeatedScalarFieldContainer[int]
    alpha: float
    beta: float
    filter: WeightDef
    bias: WeightDef
    relu_flag: bool
    adj: _containers.RepeatedScalarFieldContainer[int]
    target_shape: _containers.RepeatedScalarFieldContainer[int]
    before_pad: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, mode: _Optional[int] = ..., algo: _Optional[int] = ..., pad_mode: _Optional[int] = ..., group: _Optional[int] = ..., num_output: _Optional[int] = ..., pad: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., dilation: _Optional[_Iterable[int]] = ..., kernel: _Optional[_Iterable[int]] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., filter: _Optional[_Union[WeightDef, _Mapping]] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ..., relu_flag: bool = ..., adj: _Optional[_Iterable[int]] = ..., target_shape: _Optional[_Iterable[int]] = ..., before_pad: _Optional[_Iterable[int]] = ...) -> None: ...

class PoolingOpParams(_message.Message):
    __slots__ = ("mode", "nan_opt", "pad_mode", "global_pooling", "window", "pad", "stride", "ceil_mode", "data_mode", "alpha", "beta", "before_pad")
    MODE_FIELD_NUMBER: _ClassVar[int]
    NAN_OPT_FIELD_NUMBER: _ClassVar[int]
    PAD_MODE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_POOLING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    CEIL_MODE_FIELD_NUMBER: _ClassVar[int]
    DATA_MODE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    BEFORE_PAD_FIELD_NUMBER: _ClassVar[int]
    mode: int
    nan_opt: int
    pad_mode: int
    global_pooling: bool
    window: _containers.RepeatedScalarFieldContainer[int]
    pad: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    ceil_mode: bool
    data_mode: int
    alpha: float
    beta: float
    before_pad: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, mode: _Optional[int] = ..., nan_opt: _Optional[int] = ..., pad_mode: _Optional[int] = ..., global_pooling: bool = ..., window: _Optional[_Iterable[int]] = ..., pad: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., ceil_mode: bool = ..., data_mode: _Optional[int] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., before_pad: _Optional[_Iterable[int]] = ...) -> None: ...

class EltwiseOpParams(_message.Message):
    __slots__ = ("mode", "coeff", "alpha", "beta", "weight", "relu_flag")
    MODE_FIELD_NUMBER: _ClassVar[int]
    COEFF_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RELU_FLAG_FIELD_NUMBER: _ClassVar[int]
    mode: int
    coeff: _containers.RepeatedScalarFieldContainer[float]
    alpha: float
    beta: float
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    relu_flag: bool
    def __init__(self, mode: _Optional[int] = ..., coeff: _Optional[_Iterable[float]] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ..., relu_flag: bool = ...) -> None: ...

class ActivationOpParams(_message.Message):
    __slots__ = ("mode", "coef", "alpha", "beta")
    MODE_FIELD_NUMBER: _ClassVar[int]
    COEF_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    mode: int
    coef: float
    alpha: float
    beta: float
    def __init__(self, mode: _Optional[int] = ..., coef: _Optional[float] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ...) -> None: ...

class BatchNormOpParams(_message.Message):
    __slots__ = ("mode", "alpha", "beta", "epsilon", "use_global_stats", "moving_average_fraction", "estimated_mean", "estimated_variance", "scale", "bias")
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    USE_GLOBAL_STATS_FIELD_NUMBER: _ClassVar[int]
    MOVING_AVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_MEAN_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    mode: int
    alpha: float
    beta: float
    epsilon: float
    use_global_stats: bool
    moving_average_fraction: float
    estimated_mean: WeightDef
    estimated_variance: WeightDef
    scale: WeightDef
    bias: WeightDef
    def __init__(self, mode: _Optional[int] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., epsilon: _Optional[float] = ..., use_global_stats: bool = ..., moving_average_fraction: _Optional[float] = ..., estimated_mean: _Optional[_Union[WeightDef, _Mapping]] = ..., estimated_variance: _Optional[_Union[WeightDef, _Mapping]] = ..., scale: _Optional[_Union[WeightDef, _Mapping]] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ...) -> None: ...

class ScaleOpParams(_message.Message):
    __slots__ = ("scale", "bias")
    SCALE_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    scale: WeightDef
    bias: WeightDef
    def __init__(self, scale: _Optional[_Union[WeightDef, _Mapping]] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ...) -> None: ...

class ReshapeOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "shape", "axis", "num_axes", "format")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    NUM_AXES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    shape: ShapeDef
    axis: int
    num_axes: int
    format: int
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., shape: _Optional[_Union[ShapeDef, _Mapping]] = ..., axis: _Optional[int] = ..., num_axes: _Optional[int] = ..., format: _Optional[int] = ...) -> None: ...

class SoftmaxOpParams(_message.Message):
    __slots__ = ("algo", "mode", "alpha", "beta")
    ALGO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    algo: int
    mode: int
    alpha: float
    beta: float
    def __init__(self, algo: _Optional[int] = ..., mode: _Optional[int] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ...) -> None: ...

class FullConnectionOpParams(_message.Message):
    __slots__ = ("filter", "bias", "num_output", "relu_flag")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RELU_FLAG_FIELD_NUMBER: _ClassVar[int]
    filter: WeightDef
    bias: WeightDef
    num_output: int
    relu_flag: bool
    def __init__(self, filter: _Optional[_Union[WeightDef, _Mapping]] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ..., num_output: _Optional[int] = ..., relu_flag: bool = ...) -> None: ...

class FlattenOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "start_axis", "end_axis")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    START_AXIS_FIELD_NUMBER: _ClassVar[int]
    END_AXIS_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    start_axis: int
    end_axis: int
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., start_axis: _Optional[int] = ..., end_axis: _Optional[int] = ...) -> None: ...

class AddLimitedOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "axis", "broadcast", "weight")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    axis: int
    broadcast: bool
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., axis: _Optional[int] = ..., broadcast: bool = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ...) -> None: ...

class MulLimitedOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "axis", "broadcast", "weight")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    axis: int
    broadcast: bool
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., axis: _Optional[int] = ..., broadcast: bool = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ...) -> None: ...

class AddOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "weight")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ...) -> None: ...

class MulOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "weight")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ...) -> None: ...

class SubOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "weight")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    weight: _containers.RepeatedCompositeFieldContainer[WeightDef]
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., weight: _Optional[_Iterable[_Union[WeightDef, _Mapping]]] = ...) -> None: ...

class BiasAddOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "bias")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    bias: WeightDef
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ...) -> None: ...

class MatMulOpParams(_message.Message):
    __slots__ = ("alpha", "beta", "transposeX", "transposeW", "filter", "bias")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    TRANSPOSEX_FIELD_NUMBER: _ClassVar[int]
    TRANSPOSEW_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    transposeX: bool
    transposeW: bool
    filter: WeightDef
    bias: WeightDef
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., transposeX: bool = ..., transposeW: bool = ..., filter: _Optional[_Union[WeightDef, _Mapping]] = ..., bias: _Optional[_Union[WeightDef, _Mapping]] = ...) -> None: ...

class RsqrtOpParams(_message.Message):
    __slots__ = ("alpha", "beta")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ...) -> None: ...

class WeightDef(_message.Message):
    __slots__ = ("format", "data_type", "shape", "data", "data_offset", "cmps_size", "cmps_tab", "cmps_tab_offset", "cmps_info", "alloffset_quantize_info")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CMPS_SIZE_FIELD_NUMBER: _ClassVar[int]
    CMPS_TAB_FIELD_NUMBER: _ClassVar[int]
    CMPS_TAB_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CMPS_INFO_FIELD_NUMBER: _ClassVar[int]
    ALLOFFSET_QUANTIZE_INFO_FIELD_NUMBER: _ClassVar[int]
    format: int
    data_type: int
    shape: ShapeDef
    data: bytes
    data_offset: int
    cmps_size: int
    cmps_tab: bytes
    cmps_tab_offset: int
    cmps_info: CompressInfo
    alloffset_quantize_info: AllOffsetQuantizeInfo
    def __init__(self, format: _Optional[int] = ..., data_type: _Optional[int] = ..., shape: _Optional[_Union[ShapeDef, _Mapping]] = ..., data: _Optional[bytes] = ..., data_offset: _Optional[int] = ..., cmps_size: _Optional[int] = ..., cmps_tab: _Optional[bytes] = ..., cmps_tab_offset: _Optional[int] = ..., cmps_info: _Optional[_Union[CompressInfo, _Mapping]] = ..., alloffset_quantize_info: _Optional[_Union[AllOffsetQuantizeInfo, _Mapping]] = ...) -> None: ...

class ShapeDef(_message.Message):
    __slots__ = ("dim",)
    DIM_FIELD_NUMBER: _ClassVar[int]
    dim: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dim: _Optional[_Iterable[int]] = ...) -> None: ...

class AllOffsetQuantizeInfo(_message.Message):
    __slots__ = ("scale", "offset")
    SCALE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    scale: float
    offset: int
    def __init__(self, scale: _Optional[float] = ..., offset: _Optional[int] = ...) -> None: ...

class TensorDescriptor(_message.Message):
    __slots__ = ("format", "data_type", "dim", "size", "reuse_input", "output_tensor", "device_type", "input_tensor", "real_dim_cnt", "reuse_input_index", "alloffset_quantize_info")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REUSE_INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TENSOR_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TENSOR_FIELD_NUMBER: _ClassVar[int]
    REAL_DIM_CNT_FIELD_NUMBER: _ClassVar[int]
    REUSE_INPUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    ALLOFFSET_QUANTIZE_INFO_FIELD_NUMBER: _ClassVar[int]
    format: int
    data_type: int
    dim: _containers.RepeatedScalarFieldContainer[int]
    size: int
    reuse_input: bool
    output_tensor: bool
    device_type: DeviceType
    input_tensor: bool
    real_dim_cnt: int
    reuse_input_index: int
    alloffset_quantize_info: AllOffsetQuantizeInfo
    def __init__(self, format: _Optional[int] = ..., data_type: _Optional[int] = ..., dim: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., reuse_input: bool = ..., output_tensor: bool = ..., device_type: _Optional[_Union[DeviceType, str]] = ..., input_tensor: bool = ..., real_dim_cnt: _Optional[int] = ..., reuse_input_index: _Optional[int] = ..., alloffset_quantize_info: _Optional[_Union[AllOffsetQuantizeInfo, _Mapping]] = ...) -> None: ...

class CompressInfo(_message.Message):
    __slots__ = ("blockRow", "blockCol", "fractalK", "fractalN", "lastFractalK", "lastFractalN", "cubeSize", "loadDir")
    BLOCKROW_FIELD_NUMBER: _ClassVar[int]
    BLOCKCOL_FIELD_NUMBER: _ClassVar[int]
    FRACTALK_FIELD_NUMBER: _ClassVar[int]
    FRACTALN_FIELD_NUMBER: _ClassVar[int]
    LASTFRACTALK_FIELD_NUMBER: _ClassVar[int]
    LASTFRACTALN_FIELD_NUMBER: _ClassVar[int]
    CUBESIZE_FIELD_NUMBER: _ClassVar[int]
    LOADDIR_FIELD_NUMBER: _ClassVar[int]
    blockRow: int
    blockCol: int
    fractalK: int
    fractalN: int
    lastFractalK: int
    lastFractalN: int
    cubeSize: int
    loadDir: int
    def __init__(self, blockRow: _Optional[int] = ..., blockCol: _Optional[int] = ..., fractalK: _Optional[int] = ..., fractalN: _Optional[int] = ..., lastFractalK: _Optional[int] = ..., lastFractalN: _Optional[int] = ..., cubeSize: _Optional[int] = ..., loadDir: _Optional[int] = ...) -> None: ...

class AttrDef(_message.Message):
    __slots__ = ("s", "i", "f", "b", "u", "bt", "list", "func")
    class ListValue(_message.Message):
        __slots__ = ("s", "i", "f", "b", "u", "bt")
        S_FIELD_NUMBER: _ClassVar[int]
        I_FIELD_NUMBER: _ClassVar[int]
        F_FIELD_NUMBER: _ClassVar[int]
        B_FIELD_NUMBER: _ClassVar[int]
        U_FIELD_NUMBER: _ClassVar[int]
        BT_FIELD_NUMBER: _ClassVar[int]
        s: _containers.RepeatedScalarFieldContainer[str]
        i: _containers.RepeatedScalarFieldContainer[int]
        f: _containers.RepeatedScalarFieldContainer[float]
        b: _containers.RepeatedScalarFieldContainer[bool]
        u: _containers.RepeatedScalarFieldContainer[int]
        bt: _containers.RepeatedScalarFieldContainer[bytes]
        def __init__(self, s: _Optional[_Iterable[str]] = ..., i: _Optional[_Iterable[int]] = ..., f: _Optional[_Iterable[float]] = ..., b: _Optional[_Iterable[bool]] = ..., u: _Optional[_Iterable[int]] = ..., bt: _Optional[_Iterable[bytes]] = ...) -> None: ...
    S_FIELD_NUMBER: _ClassVar[int]
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    U_FIELD_NUMBER: _ClassVar[int]
    BT_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    FUNC_FIELD_NUMBER: _ClassVar[int]
    s: str
    i: int
    f: float
    b: bool
    u: int
    bt: bytes
    list: AttrDef.ListValue
    func: NamedAttrs
    def __init__(self, s: _Optional[str] = ..., i: _Optional[int] = ..., f: _Optional[float] = ..., b: bool = ..., u: _Optional[int] = ..., bt: _Optional[bytes] = ..., list: _Optional[_Union[AttrDef.ListValue, _Mapping]] = ..., func: _Optional[_Union[NamedAttrs, _Mapping]] = ...) -> None: ...

class NamedAttrs(_message.Message):
    __slots__ = ("name", "attr")
    class AttrEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrDef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrDef, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: str
    attr: _containers.MessageMap[str, AttrDef]
    def __init__(self, name: _Optional[str] = ..., attr: _Optional[_Mapping[str, AttrDef]] = ...) -> None: ...
