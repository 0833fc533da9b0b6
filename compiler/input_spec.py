"""Parsing of ``--input-shape`` and ``--inputs``, and seeded random inputs."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compiler.errors import InputShapeError, ModelFileError
from compiler.ir.types import TensorType

if TYPE_CHECKING:
    from compiler.ir.graph import Graph

__all__ = [
    "parse_input_shapes",
    "load_inputs",
    "random_inputs",
    "random_graph_inputs",
    "index_bounds",
    "check_inputs",
    "sample_shapes",
]


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=1x3x224x224`` items (several may be joined by commas)."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        for item in _split_items(spec):
            name, sep, dims = item.rpartition("=")
            if not sep or not name:
                raise InputShapeError(
                    f"--input-shape {item!r}: expected NAME=D1xD2x... (e.g. input=1x3x224x224)"
                )
            try:
                shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
            except ValueError:
                raise InputShapeError(
                    f"--input-shape {item!r}: dimensions must be integers joined by 'x'"
                ) from None
            if any(d < 1 for d in shape):
                raise InputShapeError(f"--input-shape {item!r}: dimensions must be >= 1")
            out[name] = shape
    return out


def _split_items(spec: str) -> list[str]:
    # "a=1x2,b=3" -> two items; a comma is only a separator when followed by NAME=
    parts = [p for p in spec.split(",") if p]
    items: list[str] = []
    for p in parts:
        if "=" in p or not items:
            items.append(p)
        else:
            items[-1] += "," + p
    return items


def load_inputs(path: Path) -> dict[str, np.ndarray]:
    """Load named inputs from a .npz (or a single .npy, returned under key '')."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: inputs file not found")
    try:
        if path.suffix == ".npy":
            return {"": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelFileError(f"{path}: not a readable .npz/.npy inputs file ({exc})") from None


# Ops that hand an integer tensor's values on unchanged (an index input stays an index).
_INDEX_PASS_THROUGH = frozenset(
    {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose"}
)
_INDEXING = frozenset({"Gather", "GatherElements"})


def index_bounds(graph: Graph) -> dict[str, int]:
    """For each integer graph input that (through value-preserving ops) indexes a Gather or
    GatherElements, the smallest size of the gathered axis: valid indices are [0, bound)."""
    bounds: dict[str, int] = {}
    for value in graph.inputs:
        if value.type.dtype.is_float or value.type.dtype.name == "BOOL":
            continue
        todo, seen = [value], set()
        while todo:
            v = todo.pop()
            if (v.node, v.port) in seen:
                continue
            seen.add((v.node, v.port))
            for user, port in graph.users(v):
                if user.op in _INDEX_PASS_THROUGH and port == 0:
                    todo.extend(graph.outputs_of(user))
                elif user.op in _INDEXING and port == 1 and not user.domain:
                    data = graph.inputs_of(user)[0]
                    shape = None if data is None else data.type.shape
                    if shape:
                        dim = shape[user.attrs.axis % len(shape)]
                        if isinstance(dim, int) and dim > 0:
                            bounds[value.name] = min(bounds.get(value.name, dim), dim)
    return bounds


def random_inputs(
    types: Mapping[str, TensorType], seed: int = 0, bounds: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Seeded inputs for each graph input: N(0,1) floats, random bools, and small non-negative
    ints in [0, 4), or [0, bound) for an input that indexes a smaller axis (:func:`index_bounds`)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, t in types.items():
        shape = t.static_shape
        if t.dtype.is_float:
            out[name] = rng.standard_normal(shape).astype(t.dtype.numpy)
        elif t.dtype.name == "BOOL":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            high = min(4, (bounds or {}).get(name, 4))
            out[name] = rng.integers(0, high, shape).astype(t.dtype.numpy)
    return out


def random_graph_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`random_inputs` for ``graph``'s inputs, with its index inputs kept in range."""
    return random_inputs(graph.input_types(), seed, index_bounds(graph))


def check_inputs(
    feeds: dict[str, np.ndarray], types: Mapping[str, TensorType], source: str
) -> dict[str, np.ndarray]:
    """Match feeds to graph inputs by name, check shapes and cast dtypes; names the offender."""
    if set(feeds) == {""} and len(types) == 1:
        feeds = {next(iter(types)): feeds[""]}
    missing = [n for n in types if n not in feeds]
    if missing:
        raise InputShapeError(
            f"{source}: no array for model input(s) {', '.join(missing)} (has {sorted(feeds)})"
        )
    out = {}
    for name, t in types.items():
        arr = feeds[name]
        if t.shape is not None:
            want = tuple(t.shape)
            ok = len(want) == arr.ndim and all(
                not isinstance(w, int) or w == d for w, d in zip(want, arr.shape, strict=False)
            )
            if not ok:
                raise InputShapeError(
                    f"{source}: input {name!r} has shape {list(arr.shape)}, model expects {list(want)}"
                )
        out[name] = arr.astype(t.dtype.numpy, copy=False)
    return out


def sample_shapes(
    path: Path,
    types: Mapping[str, TensorType],
    names: Sequence[str],
    *,
    is_calib: bool,
    preprocess: str | None = None,
) -> dict[str, tuple[int, ...]]:
    """The shapes of inputs ``names`` taken from samples: an ``--inputs`` file (each array as fed)
    or calibration data (its first sample, without the stack axis); names the file on a mismatch."""
    if is_calib:
        from compiler.calibration.dataset import load_calibration

        arrays = load_calibration(path, types, count=1, preprocess=preprocess)[0]
    else:
        arrays = load_inputs(path)
        if set(arrays) == {""} and len(types) == 1:
            arrays = {next(iter(types)): arrays[""]}
    out: dict[str, tuple[int, ...]] = {}
    for name in names:
        if name not in arrays:
            raise InputShapeError(
                f"{path}: no array for input {name!r}, whose shape is dynamic; give --input-shape {name}=..."
            )
        shape, want = tuple(int(d) for d in np.shape(arrays[name])), types[name].shape
        if want is not None and len(want) != len(shape):
            raise InputShapeError(
                f"{path}: input {name!r} has shape {list(shape)}, model expects {list(want)}"
            )
        out[name] = shape
    return out
