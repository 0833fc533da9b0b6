"""A session-wide emulated aarch64 TVM RPC server for the ARM tests (import the fixture to use it).

The server runs under qemu from ``.arm/`` (made by ``scripts/setup_arm.sh``, which ``make test``
runs first). A missing setup is a failure that says how to make it, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.tvm.arm_emulator import DEFAULT_ARM_DIR, ArmEmulatorError, arm_python, emulated_rpc_server
from backends.tvm.rpc import RpcAddress

__all__ = ["arm_rpc"]


@pytest.fixture(scope="session")
def arm_rpc() -> Iterator[RpcAddress]:
    """The address of one emulated aarch64 RPC server shared by the whole test session."""
    missing = None
    try:
        arm_python(DEFAULT_ARM_DIR)
    except ArmEmulatorError as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(f"the ARM tests need the emulated aarch64 setup: {missing}", pytrace=False)
    with emulated_rpc_server(DEFAULT_ARM_DIR) as addr:
        yield addr
