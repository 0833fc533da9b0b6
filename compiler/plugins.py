"""Plug-in entry points: the one place where ``compiler/`` names frontends and backends.

``compiler/`` never imports a frontend or a backend module. It names them here, as
``"module:attribute"`` strings resolved on first use, so that the layering is

    compiler (IR, ops, passes infrastructure, driver)  <-  frontends, backends  <-  formats (schemas/)

and an ONNX-only compile never imports TVM. :mod:`compiler.backend` resolves the backends
listed in :data:`BACKENDS`; :func:`load_model` and :func:`detect_format` go to the frontend
registry.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.ir.graph import Graph

__all__ = ["BACKENDS", "FRONTEND_REGISTRY", "TVM_RUNTIME", "TVM_RPC", "entry", "load_model", "detect_format"]

FRONTEND_REGISTRY = "frontends.registry"

# backend name -> "module:attribute" of its Backend object (see compiler.backend.Backend)
BACKENDS: dict[str, str] = {
    "onnx": "backends.onnx.backend:BACKEND",
    "mnn": "backends.mnn.backend:BACKEND",
    "cann": "backends.cann.backend:BACKEND",
    "tvm": "backends.tvm.backend:BACKEND",
}


# TVM's runtime and RPC client, for ``kiln run/bench`` of ``.so`` libraries (also over --rpc)
TVM_RUNTIME = "backends.tvm.runtime"
TVM_RPC = "backends.tvm.rpc"


def entry(spec: str) -> Any:
    """The object a ``"module:attribute"`` entry point names (imports the module)."""
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def load_model(
    path: str | os.PathLike[str], *, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Load a model file of any registered format into a Kiln Graph (the frontend registry's loader)."""
    graph: Graph = entry(f"{FRONTEND_REGISTRY}:load_model")(path, input_shapes=input_shapes)
    return graph


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format name of a model file, by suffix first and then by magic bytes."""
    name: str = entry(f"{FRONTEND_REGISTRY}:detect_format")(path)
    return name
