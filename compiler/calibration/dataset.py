"""Calibration data: one feed dict per sample, from arrays or images, in a fixed order.

Accepted forms of ``path``:

* a ``.npz`` whose keys are the model's input names, each array ``[S, *input_shape]``
  (a single-input model may also use the key ``arr_0`` that ``np.savez`` writes);
* a ``.npy`` ``[S, *input_shape]``, for a single-input model;
* a folder of ``.npz``/``.npy`` files, taken in name order, each one sample or a stack;
* a folder of images (``.png .jpg .jpeg .bmp``, name order) or one image, decoded with
  Pillow and shaped by ``--preprocess`` (see :mod:`compiler.calibration.images`).

An array whose rank equals the input's rank is one sample; one more leading axis makes
a stack of samples (an input of unknown rank is always read as a stack). Dimensions
given as ints must match; symbolic ones accept any size. Arrays are cast to the input
dtype. Samples keep file order, then stack order; ``count`` keeps the first ``count``.
"""

from __future__ import annotations

import logging
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from compiler.calibration.images import IMAGE_SUFFIXES, Preprocess, load_image, parse_preprocess
from compiler.errors import InputShapeError, ModelFileError, OptionError
from compiler.ir.types import TensorType

__all__ = ["load_calibration", "Preprocess", "parse_preprocess", "ARRAY_SUFFIXES", "IMAGE_SUFFIXES"]

log = logging.getLogger(__name__)

ARRAY_SUFFIXES = frozenset({".npz", ".npy"})

Sample = dict[str, np.ndarray]


def load_calibration(
    path: Path,
    input_types: Mapping[str, TensorType],
    *,
    count: int | None = None,
    preprocess: str | None = None,
) -> list[Sample]:
    """Load calibration samples for a model with inputs ``input_types``.

    Args:
        path: A ``.npz``/``.npy`` file, an image, or a folder of either kind.
        input_types: The model's inputs, in order, by name.
        count: Keep only the first ``count`` samples (None: all).
        preprocess: ``--preprocess`` spec for images (rejected for arrays).

    Returns:
        One dict ``{input name: array}`` per sample, arrays shaped and typed like the inputs.

    Raises:
        ModelFileError: The path is missing, empty, corrupt, or holds no samples.
        InputShapeError: An array names no input, misses one, or has the wrong shape.
        OptionError: A bad ``count`` or ``preprocess``, or images without Pillow.
    """
    path = Path(path)
    if count is not None and count < 1:
        raise OptionError(f"calibration sample count must be >= 1, got {count}")
    if not input_types:
        raise InputShapeError(f"{path}: the model has no inputs to calibrate")
    files = _files(path)
    images = files[0].suffix.lower() in IMAGE_SUFFIXES
    if preprocess and not images:
        raise OptionError(f"--preprocess applies to image calibration data; {path} holds arrays")
    prep = parse_preprocess(preprocess or "")
    samples: list[Sample] = []
    for f in files:
        if count is not None and len(samples) >= count:
            break
        samples.extend(_image_sample(f, input_types, prep) if images else _array_samples(f, input_types))
    if not samples:
        raise ModelFileError(f"{path}: holds no calibration samples")
    if count is not None and len(samples) < count:
        log.warning("%s: asked for %d calibration samples, found %d", path, count, len(samples))
    return samples[:count]


def _files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix.lower() not in ARRAY_SUFFIXES | IMAGE_SUFFIXES:
            raise ModelFileError(f"{path}: calibration data must be .npz, .npy, an image or a folder of them")
        return [path]
    if not path.is_dir():
        raise ModelFileError(f"{path}: calibration data not found")
    visible = (p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    files = sorted(visible, key=lambda p: p.name)
    arrays = [p for p in files if p.suffix.lower() in ARRAY_SUFFIXES]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if arrays and images:
        raise ModelFileError(
            f"{path}: mixes array files ({arrays[0].name}) and images ({images[0].name}); use one kind"
        )
    if not (arrays or images):
        raise ModelFileError(
            f"{path}: empty calibration folder (no .npz, .npy, .png, .jpg, .jpeg or .bmp files)"
        )
    return arrays or images


def _read(f: Path) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(f, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            return {"": loaded}
        with loaded as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise ModelFileError(f"{f}: not a readable .npz/.npy file ({exc})") from None


def _array_samples(f: Path, types: Mapping[str, TensorType]) -> list[Sample]:
    arrays = _read(f)
    names = list(types)
    if len(arrays) == 1 and next(iter(arrays)) in ("", "arr_0") and names[0] not in arrays:
        if len(names) != 1:
            raise InputShapeError(
                f"{f}: holds one unnamed array but the model has inputs {names}; "
                f"use a .npz keyed by input name"
            )
        arrays = {names[0]: next(iter(arrays.values()))}
    unknown = sorted(set(arrays) - set(types))
    if unknown:
        raise InputShapeError(f"{f}: array(s) {unknown} name no model input (inputs: {names})")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputShapeError(f"{f}: no array for model input(s) {missing} (has {sorted(arrays)})")
    stacks = {n: _as_stack(f, n, arrays[n], types[n]) for n in names}
    sizes = {n: s.shape[0] for n, s in stacks.items()}
    if len(set(sizes.values())) != 1:
        raise InputShapeError(f"{f}: inputs hold different sample counts {sizes}")
    return [{n: s[i] for n, s in stacks.items()} for i in range(next(iter(sizes.values())))]


def _as_stack(f: Path, name: str, a: np.ndarray, t: TensorType) -> np.ndarray:
    """``a`` as ``[S, *shape]`` cast to the input dtype; a single sample gets ``S = 1``."""
    if t.shape is not None:
        want = tuple(t.shape)
        if a.ndim == len(want):
            a = a[None]
        elif a.ndim != len(want) + 1:
            raise InputShapeError(
                f"{f}: input {name!r} has shape {list(a.shape)}; expected one sample "
                f"{list(want)} or a stack [S, {', '.join(map(str, want))}]"
            )
        if any(isinstance(w, int) and w != d for w, d in zip(want, a.shape[1:], strict=True)):
            raise InputShapeError(
                f"{f}: input {name!r} samples have shape {list(a.shape[1:])}, model expects {list(want)}"
            )
    elif a.ndim == 0:
        raise InputShapeError(f"{f}: input {name!r} is a scalar; expected a stack of samples [S, ...]")
    if a.dtype.kind not in "biuf":
        raise InputShapeError(f"{f}: input {name!r} has dtype {a.dtype}, model expects {t.dtype.numpy}")
    return np.ascontiguousarray(a.astype(t.dtype.numpy, copy=False))


def _image_sample(f: Path, types: Mapping[str, TensorType], prep: Preprocess) -> list[Sample]:
    if len(types) != 1:
        raise InputShapeError(
            f"{f}: image calibration data needs a single-input model; inputs are {list(types)}"
        )
    name, t = next(iter(types.items()))
    return [{name: load_image(f, name, t, prep)}]
