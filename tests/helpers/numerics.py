"""The one numerics helper for tests: assert agreement with explicit tolerances."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from compiler.metrics import Agreement, agreement

__all__ = ["assert_close", "assert_all_close", "agreement"]


def assert_close(
    actual: np.ndarray, expected: np.ndarray, *, rtol: float, atol: float, what: str = "output"
) -> Agreement:
    """Assert |a - e| <= atol + rtol * |e| elementwise (NaNs must match); return the metrics."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    m = agreement(a, e)
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        ok = np.array_equal(a, e) if atol == 0 else bool(np.all(np.abs(a.astype(np.int64) - e) <= atol))
    else:
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        close = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        ok = bool(np.all(close))
    assert ok, (
        f"{what}: max_abs={m.max_abs:.3g} max_rel={m.max_rel:.3g} cos={m.cosine:.6f} (rtol={rtol}, atol={atol})"
    )
    return m


def assert_all_close(
    actual: Mapping[str, np.ndarray] | list[np.ndarray],
    expected: Mapping[str, np.ndarray] | list[np.ndarray],
    *,
    rtol: float,
    atol: float,
) -> None:
    """assert_close over matching outputs (dicts by key, lists by position)."""
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping)
        assert sorted(actual) == sorted(expected), f"outputs {sorted(actual)} != {sorted(expected)}"
        for k in expected:
            assert_close(actual[k], expected[k], rtol=rtol, atol=atol, what=k)
    else:
        assert not isinstance(actual, Mapping) and len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, rtol=rtol, atol=atol, what=f"output {i}")
