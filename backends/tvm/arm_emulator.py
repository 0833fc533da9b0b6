"""An emulated aarch64 TVM RPC server on this x86_64 host, for tests and for trying ``--target arm``.

``scripts/setup_arm.sh`` prepares ``.arm/``: qemu-aarch64, an arm64 python3.11 sysroot and the
aarch64 TVM runtime, started through ``.arm/bin/arm-python``. :func:`emulated_rpc_server` runs
``arm-python -m tvm.exec.rpc_server`` on 127.0.0.1 in its own process group and yields its
address once it accepts connections (about 30 s: two emulated interpreters import TVM); on exit
it ends the whole group. The server loads ``libtvm_runtime_extra.so`` (``--load-library``, with
RTLD_GLOBAL) before any model: the runtime-only TVM does not, and it holds the packed functions
TOPI's CPU sort calls (``tvm.contrib.sort.argsort``: TopK, NonMaxSuppression). A real device's
server needs the same flag. From a shell::

    python -m backends.tvm.arm_emulator [ARM_DIR]     # prints the address, serves until Ctrl-C
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from backends.tvm.rpc import RpcAddress
from compiler.errors import KilnError

__all__ = [
    "ArmEmulatorError",
    "arm_python",
    "emulated_rpc_server",
    "DEFAULT_ARM_DIR",
    "RUNTIME_EXTRA",
    "main",
]

DEFAULT_ARM_DIR = Path(__file__).resolve().parents[2] / ".arm"
_BIND = re.compile(r"bind to 127\.0\.0\.1:(\d+)")
RUNTIME_EXTRA = Path("site") / "tvm" / "lib" / "libtvm_runtime_extra.so"
"""The aarch64 runtime's extra packed functions (the contrib sort), relative to the setup folder."""


class ArmEmulatorError(KilnError):
    """The emulated aarch64 setup is missing or its RPC server did not come up."""


def arm_python(arm_root: Path) -> Path:
    """The ``arm-python`` wrapper of a setup folder; ArmEmulatorError (saying how to make it) if absent."""
    exe = Path(arm_root) / "bin" / "arm-python"
    if not os.access(exe, os.X_OK) or not (Path(arm_root) / ".stamp").is_file():
        raise ArmEmulatorError(
            f"{exe}: no emulated aarch64 setup here; run scripts/setup_arm.sh {arm_root} as root first "
            "(it installs qemu-user and unpacks an arm64 python with the TVM runtime)"
        )
    return exe


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's whole process group; after 10 s, SIGKILL whatever is left of it."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(10.0)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return True
    except OSError:
        return False


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextmanager
def emulated_rpc_server(
    arm_root: Path, port_range: tuple[int, int] = (19090, 19199), start_timeout_s: float = 240.0
) -> Iterator[RpcAddress]:
    """Run an aarch64 TVM RPC server under qemu on 127.0.0.1 (a port in ``[lo, hi)``) while inside."""
    exe = arm_python(arm_root)
    extra = (Path(arm_root) / RUNTIME_EXTRA).resolve()
    if not extra.is_file():
        raise ArmEmulatorError(f"{extra}: missing from the aarch64 TVM runtime; rerun scripts/setup_arm.sh")
    lo, hi = port_range
    with tempfile.TemporaryDirectory(prefix="kiln-arm-rpc-") as tmp:
        log_path = Path(tmp) / "rpc_server.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [str(exe), "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                 "--port", str(lo), "--port-end", str(hi), "--load-library", str(extra)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=tmp, start_new_session=True,
            )  # fmt: skip
            try:
                port = _wait_started(proc, log_path, start_timeout_s)
                yield RpcAddress("127.0.0.1", port)
            finally:
                _stop_group(proc)


def _wait_started(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> int:
    """The port the server bound, once it accepts TCP connections."""
    deadline = time.monotonic() + timeout_s
    port: int | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ArmEmulatorError(
                f"the emulated RPC server exited with status {proc.returncode}:\n{_tail(log_path)}"
            )
        if port is None:
            m = _BIND.search(log_path.read_text(errors="replace"))
            port = int(m.group(1)) if m else None
        if port is not None and _accepts(port):
            return port
        time.sleep(0.5)
    raise ArmEmulatorError(
        f"the emulated RPC server did not start within {timeout_s:g} s:\n{_tail(log_path)}"
    )


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted, printing the ``--rpc`` address to use."""
    ap = argparse.ArgumentParser(
        prog="python -m backends.tvm.arm_emulator",
        description="Start an emulated aarch64 TVM RPC server (qemu) on 127.0.0.1.",
    )
    ap.add_argument("arm_dir", nargs="?", type=Path, default=DEFAULT_ARM_DIR,
                    help="folder made by scripts/setup_arm.sh (default: .arm in the repository)")  # fmt: skip
    ap.add_argument("--port", type=int, default=19090, help="first port to try (default 19090)")
    ap.add_argument("--port-end", type=int, default=19199, help="end of the port range (default 19199)")
    args = ap.parse_args(argv)
    try:
        with emulated_rpc_server(args.arm_dir, (args.port, args.port_end)) as addr:
            print(f"aarch64 RPC server (qemu) ready: --rpc {addr}   (Ctrl-C stops it)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except KilnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
