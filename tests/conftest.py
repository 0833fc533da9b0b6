"""Shared fixtures: the ../shared data folder (its absence is a failure, never a skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODELS = SHARED / "models"
MODEL_STEMS = ["pan_mnv3s_skin_clothes_hair", "ppocr_mobile_v2_cls", "ultraface_rfb320", "yunet_n_320"]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder; fails loudly when missing."""
    assert SHARED.is_dir(), f"../shared is missing (expected at {SHARED}); CI must provide it"
    return SHARED


from tests.helpers.arm_rpc import arm_rpc  # noqa: E402, F401 - session fixture: the emulated aarch64 RPC server
