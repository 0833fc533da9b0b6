"""Mod, Celu, Selu, Mish, ThresholdedRelu and Softsign: Kiln (interpreter, exported model) vs onnxruntime.

Integer outputs must match exactly; float32 math within rtol 1e-6 (atol 1e-7).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.ort_parity import check_parity, node_attrs, node_case, one_node_model

RTOL, ATOL = 1e-6, 1e-7

NODE_CASES = [
    "test_mod_broadcast",
    "test_mod_int64_fmod",
    "test_mod_mixed_sign_float32",
    "test_mod_mixed_sign_float64",
    "test_mod_mixed_sign_int8",
    "test_mod_mixed_sign_int32",
    "test_mod_mixed_sign_int64",
    "test_mod_uint8",
    "test_mod_uint64",
    "test_celu",
    "test_selu",
    "test_selu_default",
    "test_selu_example",
    "test_mish",
    "test_thresholdedrelu",
    "test_thresholdedrelu_default",
    "test_softsign",
    "test_softsign_example",
]


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_case(name: str) -> None:
    model, feeds = node_case(name)
    check_parity(model, feeds, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integer_signs(dtype: type, fmod: int) -> None:
    rng = np.random.default_rng(0)
    a: np.ndarray = rng.integers(-50, 50, (4, 6)).astype(dtype)
    b: np.ndarray = rng.choice([-7, -3, -1, 2, 5, 9], (6,)).astype(dtype)
    model, feeds = one_node_model("Mod", [("a", a), ("b", b)], {"fmod": fmod}, opset=13)
    p = check_parity(model, feeds, rtol=0, atol=0)
    assert node_attrs(p.exported, "Mod") == ({"fmod": 1} if fmod else {})


def test_mod_float_fmod_from_opset_10() -> None:
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((3, 5)) * 10).astype(np.float32)
    b = rng.uniform(0.5, 3.0, (3, 5)).astype(np.float32) * rng.choice([-1, 1], (3, 5)).astype(np.float32)
    model, feeds = one_node_model("Mod", [("a", a), ("b", b)], {"fmod": 1}, opset=10)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    assert p.exported_opset == 21


def test_mod_constant_divisor() -> None:
    """A constant divisor (the zoo models' form) keeps the op and its result."""
    a = np.arange(-12, 12, dtype=np.int64).reshape(4, 6)
    b = np.asarray(7, dtype=np.int64)
    model, feeds = one_node_model("Mod", [("a", a), ("b", b)], opset=17, initializers=["b"])
    check_parity(model, feeds, rtol=0, atol=0)


def _x(shape: tuple[int, ...] = (3, 4, 5), scale: float = 4.0) -> np.ndarray:
    return (np.random.default_rng(2).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("Celu", {}, 12),
        ("Celu", {"alpha": 0.4}, 12),
        ("Celu", {"alpha": 2.5}, 21),
        ("Selu", {}, 9),
        ("Selu", {"alpha": 1.2, "gamma": 0.7}, 9),
        ("Mish", {}, 18),
        ("ThresholdedRelu", {}, 10),
        ("ThresholdedRelu", {"alpha": 0.3}, 10),
        ("ThresholdedRelu", {"alpha": -1.5}, 21),
        ("Softsign", {}, 9),
    ],
)
def test_activation_attributes(op: str, attrs: dict[str, float], opset: int) -> None:
    model, feeds = one_node_model(op, [("x", _x())], attrs, opset=opset)
    p = check_parity(model, feeds, rtol=RTOL, atol=ATOL)
    got = node_attrs(p.exported, op)
    assert got.keys() == attrs.keys()
    for k, v in attrs.items():
        assert got[k] == pytest.approx(v, rel=1e-7), k


def test_mish_large_magnitudes() -> None:
    """Mish saturates to x for large x and to -0 for very negative x."""
    x = np.concatenate([np.linspace(-90, 90, 181), [-1e-3, 1e-3, 0.0]]).astype(np.float32)
    model, feeds = one_node_model("Mish", [("x", x)], opset=18)
    check_parity(model, feeds, rtol=RTOL, atol=ATOL)
