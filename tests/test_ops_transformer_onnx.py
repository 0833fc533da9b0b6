"""LpNormalization, RMSNormalization, RotaryEmbedding and Attention: Kiln vs onnxruntime.

Float32 within rtol 1e-6, atol 1e-7 (references in float64); attention on
standard-normal data sums terms of both signs, so there atol is 1e-6 (outputs
are of order 1). The opset-23 ops must come back from export under opset 23,
with their attributes.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import ConversionError
from compiler.ir.types import DType, TensorType
from frontends.onnx import load_onnx
from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model

RTOL, ATOL = 1e-6, 1e-7
MIXED_SIGN_ATOL = 1e-6

NODE_CASES = [
    "test_lpnormalization_default",
    "test_rms_normalization_2d_axis0",
    "test_rms_normalization_3d_axis1_epsilon",
    "test_rms_normalization_4d_axis_negative_2",
    "test_rms_normalization_default_axis",
    "test_rotary_embedding",
    "test_rotary_embedding_3d_input",
    "test_rotary_embedding_interleaved",
    "test_rotary_embedding_with_rotary_dim",
    "test_rotary_embedding_with_interleaved_rotary_dim",
    "test_rotary_embedding_no_position_ids",
    "test_rotary_embedding_no_position_ids_interleaved",
    "test_rotary_embedding_no_position_ids_rotary_dim",
    "test_attention_3d",
    "test_attention_3d_gqa_causal",
    "test_attention_3d_diff_heads_with_past_and_present",
    "test_attention_3d_with_past_and_present_qk_matmul_softcap",
    "test_attention_4d",
    "test_attention_4d_attn_mask_bool_4d",
    "test_attention_4d_attn_mask_3d_causal",
    "test_attention_4d_gqa_with_past_and_present",
    "test_attention_4d_diff_heads_sizes_scaled",
    "test_attention_4d_softcap",
    "test_attention_4d_softcap_neginf_mask",
    "test_attention_4d_with_qk_matmul",
    "test_attention_4d_with_qk_matmul_bias",
    "test_attention_4d_with_qk_matmul_softcap",
    "test_attention_4d_with_qk_matmul_softmax",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal",
]

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_case(name: str) -> None:
    model, feeds = node_case(name)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    if "lpnorm" not in name:
        assert p.exported_opset == 23


def test_attention_fp16() -> None:
    """fp16: ORT rounds every intermediate to half; Kiln rounds once, so 1 half ULP (~1e-3 rel)."""
    model, feeds = node_case("test_attention_4d_fp16")
    check_parity(model, feeds, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("axis", "p"), [(-1, 2), (1, 2), (0, 1), (-2, 1)])
def test_lp_normalization(axis: int, p: int) -> None:
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, :, 0] = 0.0  # a zero vector along axis 1
    model, feeds = one_node_model("LpNormalization", [("x", x)], {"axis": axis, "p": p}, opset=9)
    par = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert par.exported_opset == 21
    assert node_attrs(par.exported, "LpNormalization") == {
        k: v for k, v in {"axis": axis, "p": p}.items() if v not in (-1, 2)
    }


@pytest.mark.parametrize(
    ("axis", "epsilon", "scale_shape"), [(-1, 1e-5, (6,)), (1, 1e-3, (4, 5, 6)), (-2, 0.1, (1, 6))]
)
def test_rms_normalization(axis: int, epsilon: float, scale_shape: tuple[int, ...]) -> None:
    x = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32)
    scale = RNG.standard_normal(scale_shape).astype(np.float32)
    attrs = {"axis": axis, "epsilon": epsilon}
    model, feeds = one_node_model(
        "RMSNormalization", [("x", x), ("scale", scale)], attrs, opset=23, initializers=["scale"]
    )
    par = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert par.exported_opset == 23
    got = node_attrs(par.exported, "RMSNormalization")
    assert got.get("axis", -1) == axis and got.get("epsilon", 1e-5) == pytest.approx(epsilon)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_3d_with_positions(interleaved: int, rotary_dim: int) -> None:
    b, s, h, d = 2, 5, 3, 8
    half = (rotary_dim or d) // 2
    x = RNG.standard_normal((b, s, h * d)).astype(np.float32)
    theta = RNG.uniform(0, 2 * np.pi, (16, half))
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    pos = RNG.integers(0, 16, (b, s)).astype(np.int64)
    attrs = {"num_heads": h, "interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    ins: list[tuple[str, np.ndarray | None]] = [("x", x), ("cos", cos), ("sin", sin), ("pos", pos)]
    model, feeds = one_node_model("RotaryEmbedding", ins, attrs, opset=23, initializers=["cos", "sin"])
    par = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert node_attrs(par.exported, "RotaryEmbedding") == {k: v for k, v in attrs.items() if v}


def _qkv(b: int, hq: int, hkv: int, sq: int, skv: int, d: int) -> list[tuple[str, np.ndarray | None]]:
    return [
        ("q", RNG.standard_normal((b, hq, sq, d)).astype(np.float32)),
        ("k", RNG.standard_normal((b, hkv, skv, d)).astype(np.float32)),
        ("v", RNG.standard_normal((b, hkv, skv, d)).astype(np.float32)),
    ]


@pytest.mark.parametrize("is_causal", [0, 1])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_gqa_cache_masks(is_causal: int, mask: str, mode: int) -> None:
    b, hq, hkv, sq, skv, past, d = 2, 4, 2, 3, 3, 2, 8
    ins = _qkv(b, hq, hkv, sq, skv, d)
    m: np.ndarray | None = None
    if mask == "bool":
        m = RNG.random((sq, past + skv)) > 0.3
        m[:, 0] = True
    elif mask == "float":
        m = RNG.standard_normal((b, 1, sq, past + skv)).astype(np.float32)
    ins += [
        ("mask", m),
        ("past_k", RNG.standard_normal((b, hkv, past, d)).astype(np.float32)),
        ("past_v", RNG.standard_normal((b, hkv, past, d)).astype(np.float32)),
    ]
    attrs = {"is_causal": is_causal, "qk_matmul_output_mode": mode, "softcap": 3.0, "scale": 0.3}
    model, feeds = one_node_model("Attention", ins, attrs, opset=23, num_outputs=4)
    par = check_parity(model, feeds, rtol=RTOL, atol=MIXED_SIGN_ATOL)
    assert par.exported_opset == 23
    got = node_attrs(par.exported, "Attention")
    assert got.get("is_causal", 0) == is_causal and got["scale"] == pytest.approx(0.3)
    types = [v.type for v in load_onnx(model).outputs]
    total = past + skv
    assert types == [
        TensorType(DType.FLOAT32, (b, hq, sq, d)),
        TensorType(DType.FLOAT32, (b, hkv, total, d)),
        TensorType(DType.FLOAT32, (b, hkv, total, d)),
        TensorType(DType.FLOAT32, (b, hq, sq, total)),
    ]


def test_attention_3d_heads() -> None:
    q = RNG.standard_normal((2, 4, 6 * 8)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 2 * 8)).astype(np.float32)
    v = RNG.standard_normal((2, 5, 2 * 4)).astype(np.float32)
    attrs = {"q_num_heads": 6, "kv_num_heads": 2}
    model, feeds = one_node_model("Attention", [("q", q), ("k", k), ("v", v)], attrs, opset=23)
    par = check_parity(model, feeds, rtol=RTOL, atol=MIXED_SIGN_ATOL)
    assert node_attrs(par.exported, "Attention") == attrs
    assert load_onnx(model).outputs[0].type == TensorType(DType.FLOAT32, (2, 4, 6 * 4))


def test_attention_24_nonpad_input_is_refused() -> None:
    """Attention-24's nonpad_kv_seqlen input is not supported: the import names the node."""
    model, _ = node_case("test_attention_4d_gqa_causal_nonpad_decode")
    with pytest.raises(ConversionError, match="Attention.*7 inputs, expected 3 to 6"):
        load_onnx(model)
