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

:func:`open_calibration` reads only the headers up front and streams the samples, one at a
time, from disk (:class:`CalibrationSet`); :func:`load_calibration` loads them all.
"""

from __future__ import annotations

import logging
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, overload

import numpy as np

from compiler.calibration.images import IMAGE_SUFFIXES, Preprocess, load_image, parse_preprocess
from compiler.errors import InputShapeError, ModelFileError, OptionError
from compiler.ir.types import TensorType

__all__ = [
    "load_calibration",
    "open_calibration",
    "CalibrationSet",
    "Preprocess",
    "parse_preprocess",
    "ARRAY_SUFFIXES",
    "IMAGE_SUFFIXES",
]

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
    """Load calibration samples for a model with inputs ``input_types`` (all into memory).

    :func:`open_calibration` reads the same samples lazily.

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
    return list(open_calibration(path, input_types, count=count, preprocess=preprocess))


def open_calibration(
    path: Path,
    input_types: Mapping[str, TensorType],
    *,
    count: int | None = None,
    preprocess: str | None = None,
) -> CalibrationSet:
    """The calibration samples of ``path`` as a lazy sequence (see :class:`CalibrationSet`).

    Headers are read (and shapes checked) now; sample data only when a sample is taken.
    Arguments and errors as for :func:`load_calibration`.
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
    types = dict(input_types)
    entries: list[_Entry] = []
    for f in files:
        if count is not None and len(entries) >= count:
            break
        if images:
            if len(types) != 1:
                raise InputShapeError(
                    f"{f}: image calibration data needs a single-input model; inputs are {list(types)}"
                )
            entries.append(_Entry(f, None, 0))
        else:
            index = _index_arrays(f, types)
            entries.extend(_Entry(f, index, i) for i in range(index.count))
    if not entries:
        raise ModelFileError(f"{path}: holds no calibration samples")
    if count is not None and len(entries) < count:
        log.warning("%s: asked for %d calibration samples, found %d", path, count, len(entries))
    return CalibrationSet(entries[:count], types, prep)


class CalibrationSet(Sequence[Sample]):
    """Calibration samples read from disk on demand: iterating holds one sample at a time.

    Iteration streams each file once (one open handle per array; a compressed ``.npz`` is
    decompressed sequentially); indexing opens the file and seeks to the sample.
    """

    def __init__(self, entries: list[_Entry], types: dict[str, TensorType], prep: Preprocess) -> None:
        self._entries = entries
        self._types = types
        self._prep = prep

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...
    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        e = self._entries[i]
        if e.index is None:
            return _image_sample(e.file, self._types, self._prep)
        return e.index.read(e.position)

    def __iter__(self) -> Iterator[Sample]:
        k = 0
        while k < len(self._entries):
            e = self._entries[k]
            if e.index is None:
                yield _image_sample(e.file, self._types, self._prep)
                k += 1
                continue
            stop = k
            while stop < len(self._entries) and self._entries[stop].index is e.index:
                stop += 1
            yield from e.index.stream(e.position, stop - k)
            k = stop


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


@dataclass(frozen=True)
class _Member:
    """One array of a ``.npy``/``.npz`` file: where its data starts, and its header."""

    member: str | None  # the zip member, None for a .npy file
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int


@dataclass
class _ArrayFile:
    """A ``.npy``/``.npz`` file's arrays by input name; ``count`` samples of ``shape[1:]`` each."""

    file: Path
    members: dict[str, _Member]
    types: dict[str, TensorType]
    count: int
    single: bool  # the arrays hold one sample without a leading sample axis

    def _open(self, m: _Member) -> IO[bytes]:
        if m.member is None:
            return open(self.file, "rb")  # noqa: SIM115 - closed by the caller
        return zipfile.ZipFile(self.file).open(m.member)

    def _sample(self, name: str, raw: bytes) -> np.ndarray:
        m, t = self.members[name], self.types[name]
        a = np.frombuffer(raw, dtype=m.dtype).reshape(m.shape if self.single else m.shape[1:])
        return np.ascontiguousarray(a.astype(t.dtype.numpy, copy=True))

    def _nbytes(self, m: _Member) -> int:
        per = int(np.prod(m.shape if self.single else m.shape[1:], dtype=np.int64))
        return per * m.dtype.itemsize

    def stream(self, first: int, count: int) -> Iterator[Sample]:
        """Samples ``first .. first + count - 1``, read sequentially."""
        handles = {n: self._open(m) for n, m in self.members.items()}
        try:
            for n, m in self.members.items():
                _skip(handles[n], m.offset + first * self._nbytes(m))
            for _ in range(count):
                yield {
                    n: self._sample(n, _read_exact(self.file, handles[n], self._nbytes(m)))
                    for n, m in self.members.items()
                }
        finally:
            for h in handles.values():
                h.close()

    def read(self, position: int) -> Sample:
        """Sample ``position`` alone."""
        return next(self.stream(position, 1))


@dataclass(frozen=True)
class _Entry:
    file: Path
    index: _ArrayFile | None  # None: an image
    position: int


def _skip(h: IO[bytes], n: int) -> None:
    if h.seekable():
        h.seek(n)
        return
    while n > 0:  # pragma: no cover - zip members are seekable since Python 3.7
        n -= len(h.read(min(n, 1 << 20)))


def _read_exact(f: Path, h: IO[bytes], n: int) -> bytes:
    raw = h.read(n)
    if len(raw) != n:
        raise ModelFileError(f"{f}: truncated array data")
    return raw


def _header(f: Path, h: IO[bytes], member: str | None) -> _Member:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(h)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(h)
    except (ValueError, OSError, EOFError) as exc:
        raise ModelFileError(f"{f}: not a readable .npz/.npy file ({exc})") from None
    if fortran and len(shape) > 1:
        raise ModelFileError(f"{f}: Fortran-ordered arrays are not supported; save C-ordered arrays")
    if dtype.hasobject:
        raise ModelFileError(f"{f}: holds object arrays; expected numeric arrays")
    return _Member(member, tuple(int(d) for d in shape), dtype, h.tell())


def _headers(f: Path) -> dict[str, _Member]:
    try:
        if f.suffix.lower() == ".npy":
            with open(f, "rb") as h:
                return {"": _header(f, h, None)}
        with zipfile.ZipFile(f) as z:
            out: dict[str, _Member] = {}
            for info in z.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with z.open(info) as h:
                    out[name] = _header(f, h, info.filename)
            return out
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise ModelFileError(f"{f}: not a readable .npz/.npy file ({exc})") from None


def _index_arrays(f: Path, types: Mapping[str, TensorType]) -> _ArrayFile:
    arrays = _headers(f)
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
    single = {n: _check(f, n, arrays[n], types[n]) for n in names}
    sizes = {n: 1 if single[n] else arrays[n].shape[0] for n in names}
    if len(set(sizes.values())) != 1 or len(set(single.values())) != 1:
        raise InputShapeError(f"{f}: inputs hold different sample counts {sizes}")
    members = {n: arrays[n] for n in names}
    return _ArrayFile(f, members, dict(types), next(iter(sizes.values())), single[names[0]])


def _check(f: Path, name: str, m: _Member, t: TensorType) -> bool:
    """Check an array's shape and dtype against the input; True when it is one sample (no stack axis)."""
    single = False
    if t.shape is not None:
        want = tuple(t.shape)
        if len(m.shape) == len(want):
            single = True
        elif len(m.shape) != len(want) + 1:
            raise InputShapeError(
                f"{f}: input {name!r} has shape {list(m.shape)}; expected one sample "
                f"{list(want)} or a stack [S, {', '.join(map(str, want))}]"
            )
        got = m.shape if single else m.shape[1:]
        if any(isinstance(w, int) and w != d for w, d in zip(want, got, strict=True)):
            raise InputShapeError(
                f"{f}: input {name!r} samples have shape {list(got)}, model expects {list(want)}"
            )
    elif not m.shape:
        raise InputShapeError(f"{f}: input {name!r} is a scalar; expected a stack of samples [S, ...]")
    if m.dtype.kind not in "biuf":
        raise InputShapeError(f"{f}: input {name!r} has dtype {m.dtype}, model expects {t.dtype.numpy}")
    return single


def _image_sample(f: Path, types: Mapping[str, TensorType], prep: Preprocess) -> Sample:
    name, t = next(iter(types.items()))
    return {name: load_image(f, name, t, prep)}
