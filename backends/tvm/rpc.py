"""Run Kiln's TVM artifacts on another machine over TVM RPC (an ARM board, or qemu for tests).

An address is ``HOST:PORT`` (a ``tvm.exec.rpc_server`` listening there) or
``tracker:HOST:PORT:KEY`` (an RPC tracker that hands out a free server registered under KEY).
The client uploads ``model.so``, loads it in the remote TVM runtime and drives its Relax VM
through the stateful API (``set_input`` / ``invoke_stateful`` / ``get_outputs``), which works
over RPC for any number of outputs. ``model.json`` next to the library names and checks the feeds.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.tvm.runtime import TensorSpec, TvmModel
from compiler.errors import InputShapeError, KilnError, ModelFileError, OptionError

__all__ = ["RpcAddress", "RpcError", "RemoteModel", "connect", "run_remote", "time_remote"]

_FORMS = "HOST:PORT (an RPC server) or tracker:HOST:PORT:KEY (an RPC tracker and a device key)"


class RpcError(KilnError):
    """The RPC server or tracker cannot be reached, or the remote run failed."""


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise OptionError(f"--rpc {spec!r}: port {text!r} is not a number in 1..65535 (expected {_FORMS})")
    return int(text)


def _host(text: str, spec: str) -> str:
    bracketed = text.startswith("[") and text.endswith("]")
    if ":" in text and not bracketed:
        raise OptionError(f"--rpc {spec!r}: too many ':' (expected {_FORMS}; IPv6 hosts go in brackets)")
    host = text[1:-1] if bracketed else text
    if not host or any(c.isspace() for c in host):
        raise OptionError(f"--rpc {spec!r}: missing or malformed host (expected {_FORMS})")
    return host


@dataclass(frozen=True)
class RpcAddress:
    """Where to run: an RPC server at ``host:port``, or a tracker at ``host:port`` when ``key`` is set."""

    host: str
    port: int
    key: str | None = None

    @property
    def is_tracker(self) -> bool:
        """True when ``host:port`` is an RPC tracker (``key`` names the device kind)."""
        return self.key is not None

    @staticmethod
    def parse(spec: str) -> RpcAddress:
        """``HOST:PORT`` or ``tracker:HOST:PORT:KEY`` (an IPv6 host in brackets); OptionError otherwise."""
        text = spec.strip()
        if text.startswith("tracker:"):
            rest = text[len("tracker:") :]
            host, sep1, tail = rest.rpartition(":")  # HOST:PORT | KEY
            host, sep2, port = host.rpartition(":")
            if not (sep1 and sep2) or not tail:
                raise OptionError(f"--rpc {spec!r}: a tracker address needs HOST, PORT and KEY ({_FORMS})")
            return RpcAddress(_host(host, spec), _port(port, spec), tail)
        host, sep, port = text.rpartition(":")
        if not sep:
            raise OptionError(f"--rpc {spec!r}: no port (expected {_FORMS})")
        return RpcAddress(_host(host, spec), _port(port, spec))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tracker:{host}:{self.port}:{self.key}" if self.is_tracker else f"{host}:{self.port}"


def _wait_reachable(addr: RpcAddress, timeout_s: float) -> None:
    """Retry a TCP connect until it succeeds or ``timeout_s`` passes (the server may be starting)."""
    deadline = time.monotonic() + timeout_s
    what = "RPC tracker" if addr.is_tracker else "RPC server"
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr.host, addr.port), timeout=max(0.1, left)):
                return
        except OSError as exc:
            if time.monotonic() + 0.5 >= deadline:
                raise RpcError(f"cannot reach the {what} at {addr} within {timeout_s:g} s ({exc})") from None
        time.sleep(0.5)


def _bounded(fn: Callable[[], Any], timeout_s: float, late: str) -> Any:
    """``fn()`` on a daemon thread; RpcError(``late``) if it has not returned within ``timeout_s``.

    TVM's handshake and tracker request block until the server takes this client (it serves one
    client at a time), with no timeout of their own. A session that arrives after the caller gave
    up is dropped at once, so it cannot hold the server.
    """
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def _call() -> None:
        try:
            result: tuple[str, Any] = ("value", fn())
        except Exception as exc:  # noqa: BLE001 - TVM raises several FFI error types
            result = ("error", exc)
        with lock:
            if not box.get("abandoned"):
                box[result[0]] = result[1]
                return
        del result
        gc.collect()

    worker = threading.Thread(target=_call, name="kiln-rpc-connect", daemon=True)
    worker.start()
    worker.join(timeout_s)
    with lock:
        if "value" not in box and "error" not in box:
            box["abandoned"] = True
            raise RpcError(late)
    if "error" in box:
        raise box["error"]
    return box["value"]


def connect(addr: RpcAddress, timeout_s: float = 30.0) -> Any:
    """A TVM ``RPCSession`` to the server (direct or handed out by the tracker) within ``timeout_s``."""
    from tvm import rpc

    _wait_reachable(addr, timeout_s)
    if not addr.is_tracker:
        try:
            return _bounded(
                lambda: rpc.connect(addr.host, addr.port),
                timeout_s,
                f"RPC server {addr}: no handshake within {timeout_s:g} s (is another client using it?)",
            )
        except RpcError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise RpcError(f"RPC server {addr}: handshake failed ({_first_line(exc)})") from None
    try:
        tracker = rpc.connect_tracker(addr.host, addr.port)
        queues = tracker.summary().get("queue_info", {})
    except Exception as exc:  # noqa: BLE001
        raise RpcError(f"{addr}: not an RPC tracker ({_first_line(exc)})") from None
    if addr.key not in queues:
        known = ", ".join(sorted(queues)) or "none"
        raise RpcError(f"{addr}: the tracker has no device with key {addr.key!r} (keys: {known})")
    try:
        return _bounded(
            lambda: tracker.request(addr.key, max_retry=1),
            timeout_s,
            f"{addr}: no free {addr.key!r} device within {timeout_s:g} s",
        )
    except RpcError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise RpcError(f"{addr}: request for {addr.key!r} failed ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class _Meta:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def _load_meta(artifact: Path) -> _Meta:
    inputs, outputs, _ = TvmModel.read_meta(artifact)
    return _Meta(inputs, outputs)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in _flatten(v)]
    return [value]


class RemoteModel:
    """``model.so`` loaded in a remote TVM runtime: one RPC session, open between ``open`` and ``close``.

    The server serves one client at a time, so close the session (or use ``with``) when done.
    """

    def __init__(self, artifact: Path, addr: RpcAddress, timeout_s: float = 30.0) -> None:
        self.path = Path(artifact)
        self.addr = addr
        self.timeout_s = timeout_s
        self.meta = _load_meta(self.path)
        if not self.path.is_file():
            raise ModelFileError(f"{self.path}: no such TVM artifact")
        self._session: Any = None
        self._device: Any = None
        self._vm: Any = None

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Feeds in parameter order; InputShapeError names an unknown, missing or misfit input."""
        names = [s.name for s in self.meta.inputs]
        for k in feeds:
            if k not in names:
                raise InputShapeError(
                    f"{self.path.name}: unknown input {k!r} (the model's inputs: {', '.join(names)})"
                )
        for n in names:
            if n not in feeds:
                raise InputShapeError(
                    f"{self.path.name}: missing input {n!r} (the model's inputs: {', '.join(names)})"
                )
        return [spec.check(feeds[spec.name]) for spec in self.meta.inputs]

    def open(self) -> RemoteModel:
        """Connect, upload the library and load it in a remote Relax VM on the remote CPU."""
        from tvm.runtime.vm import VirtualMachine

        if self._vm is not None:
            return self
        self._session = connect(self.addr, self.timeout_s)
        try:
            remote_name = f"kiln_{self.path.stem}.so"
            self._session.upload(str(self.path), remote_name)
            lib = self._session.load_module(remote_name)
            self._device = self._session.cpu()
            self._vm = VirtualMachine(lib, self._device)
        except Exception as exc:  # noqa: BLE001 - TVM raises several FFI error types
            self.close()
            why = _first_line(exc)
            raise RpcError(f"{self.path}: the remote at {self.addr} cannot load it ({why})") from None
        return self

    def close(self) -> None:
        """End the session: drop every remote handle (TVM's Python objects form cycles, hence gc)."""
        self._vm = self._device = self._session = None
        gc.collect()

    def __enter__(self) -> RemoteModel:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _set(self, feeds: Mapping[str, np.ndarray]) -> None:
        import tvm

        arrays = self.check_feeds(feeds)
        self.open()
        self._vm.set_input("main", *[tvm.runtime.tensor(a, self._device) for a in arrays])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs by name (model.json order) of one remote run of ``main``."""
        self._set(feeds)
        self._vm.invoke_stateful("main")
        values = _flatten(self._vm.get_outputs("main"))
        if len(values) != len(self.meta.outputs):
            raise ModelFileError(
                f"{self.path}: main returned {len(values)} tensors but model.json lists "
                f"{len(self.meta.outputs)} outputs"
            )
        return {s.name: np.asarray(v.numpy()) for s, v in zip(self.meta.outputs, values, strict=True)}

    def time(self, feeds: Mapping[str, np.ndarray], rounds: int) -> list[float]:
        """Seconds per run of ``main`` for ``rounds`` runs, timed on the remote after one warm-up run."""
        if rounds < 1:
            raise OptionError(f"rounds must be at least 1 (got {rounds})")
        self._set(feeds)
        timer = self._vm.time_evaluator("invoke_stateful", self._device, number=1, repeat=rounds)
        return [float(t) for t in timer("main").results]


def run_remote(
    artifact: Path, feeds: Mapping[str, np.ndarray], addr: RpcAddress, timeout_s: float = 30.0
) -> dict[str, np.ndarray]:
    """Outputs by name (model.json order) of one remote run of ``main`` on ``feeds``."""
    model = RemoteModel(artifact, addr, timeout_s)
    model.check_feeds(feeds)  # before connecting
    with model:
        return model.run(feeds)


def time_remote(
    artifact: Path, feeds: Mapping[str, np.ndarray], addr: RpcAddress, rounds: int, timeout_s: float = 30.0
) -> list[float]:
    """Seconds per run of ``main`` for ``rounds`` runs on the remote (after one warm-up run)."""
    if rounds < 1:
        raise OptionError(f"rounds must be at least 1 (got {rounds})")
    model = RemoteModel(artifact, addr, timeout_s)
    model.check_feeds(feeds)
    with model:
        return model.time(feeds, rounds)
