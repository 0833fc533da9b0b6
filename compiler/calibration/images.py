"""Image calibration samples: the ``--preprocess`` grammar and decoding with Pillow.

Grammar (items joined by commas, names case-insensitive)::

    spec   := item ("," item)*
    item   := "resize=" H "x" W          resize to height H, width W (bilinear)
            | "mean=" nums | "std=" nums  one value, or one per channel
            | "scale=" num ["/" num]      e.g. scale=1/255
            | "layout=" ("NCHW" | "NHWC")
            | "bgr" | "rgb"               channel order fed to the model (default rgb)
    nums   := num ((";" | ":") num)*

Each image becomes ``x = (pixels * scale - mean) / std`` in float32, with ``pixels`` the
8-bit values in the model's channel order (``mean``/``std`` are given in that order too).
The channel count (1: grayscale, 3: colour) comes from the input shape. Without
``layout`` the input is NCHW unless its last dimension is 1 or 3 and its second is not.
A batch axis of 1 is added when the input has rank 4. Without ``resize`` the image must
already have the input's height and width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from compiler.errors import InputShapeError, ModelFileError, OptionError
from compiler.ir.types import TensorType

__all__ = ["IMAGE_SUFFIXES", "Preprocess", "parse_preprocess", "load_image"]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp"})
_FLAG = "--preprocess"


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes a model input (see the module docstring for the grammar).

    Attributes:
        resize: ``(height, width)`` to resize to, or None to keep the image's size.
        mean: Subtracted after scaling; one value or one per channel.
        std: Divided by after the mean; one value or one per channel.
        scale: Multiplies the 8-bit pixel values first.
        layout: ``NCHW``, ``NHWC``, or None to follow the input shape.
        bgr: Feed channels in BGR order.
    """

    resize: tuple[int, int] | None = None
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1.0
    layout: Literal["NCHW", "NHWC"] | None = None
    bgr: bool = False


def _number(item: str, text: str) -> float:
    try:
        num, sep, den = text.partition("/")
        value = float(num) / float(den) if sep else float(num)
    except (ValueError, ZeroDivisionError):
        raise OptionError(f"{_FLAG} item {item!r}: {text!r} is not a number") from None
    if not np.isfinite(value):
        raise OptionError(f"{_FLAG} item {item!r}: {text!r} is not a finite number")
    return value


def parse_preprocess(text: str) -> Preprocess:
    """Parse a ``--preprocess`` spec such as ``resize=224x224,mean=0.485;0.456;0.406,scale=1/255``.

    Raises:
        OptionError: An unknown item or a malformed value; names the item.
    """
    fields: dict[str, object] = {}
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        key, sep, value = (s.strip() for s in raw.partition("="))
        key = key.lower()
        if not sep and key in ("bgr", "rgb"):
            fields["bgr"] = key == "bgr"
        elif key == "resize" and sep:
            h, x, w = value.lower().partition("x")
            if not (x and h.strip().isdigit() and w.strip().isdigit() and int(h) > 0 and int(w) > 0):
                raise OptionError(f"{_FLAG} item {raw!r}: expected resize=HxW with positive integers")
            fields["resize"] = (int(h), int(w))
        elif key in ("mean", "std") and sep:
            values = tuple(_number(raw, v) for v in value.replace(":", ";").split(";"))
            if key == "std" and any(v == 0 for v in values):
                raise OptionError(f"{_FLAG} item {raw!r}: std must not be 0")
            fields[key] = values
        elif key == "scale" and sep:
            fields["scale"] = _number(raw, value)
        elif key == "layout" and sep and value.upper() in ("NCHW", "NHWC"):
            fields["layout"] = value.upper()
        else:
            raise OptionError(
                f"{_FLAG} item {raw!r}: expected resize=HxW, mean=, std=, scale=, "
                f"layout=NCHW|NHWC, bgr or rgb"
            )
    return Preprocess(**fields)  # type: ignore[arg-type]


def _layout(t: TensorType, prep: Preprocess) -> str:
    if prep.layout is not None:
        return prep.layout
    shape = t.shape or ()
    if len(shape) >= 3 and shape[-1] in (1, 3) and shape[-3] not in (1, 3):
        return "NHWC"
    return "NCHW"


def load_image(path: Path, name: str, t: TensorType, prep: Preprocess) -> np.ndarray:
    """Decode one image file into the array for input ``name`` of type ``t``.

    Raises:
        OptionError: Pillow is missing, or mean/std do not fit the channel count.
        ModelFileError: The file is not a readable image.
        InputShapeError: The input cannot take an image, or the image size does not fit.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise OptionError(
            f"{path}: calibration images need Pillow: pip install kiln-compiler[images]"
        ) from None
    shape = t.shape
    if (
        shape is None
        or len(shape) not in (3, 4)
        or (len(shape) == 4 and shape[0] not in (1,) and isinstance(shape[0], int))
    ):
        raise InputShapeError(
            f"{path}: input {name!r} of type {t} cannot take an image "
            f"(needs [1,C,H,W], [C,H,W] or the NHWC forms)"
        )
    layout = _layout(t, prep)
    c_dim = shape[-3] if layout == "NCHW" else shape[-1]
    channels = c_dim if isinstance(c_dim, int) else 3
    if channels not in (1, 3):
        raise InputShapeError(f"{path}: input {name!r} has {channels} channels; images give 1 or 3")
    try:
        with Image.open(path) as src:
            img = src.convert("L" if channels == 1 else "RGB")
        if prep.resize is not None:
            img = img.resize((prep.resize[1], prep.resize[0]), Image.Resampling.BILINEAR)
        pixels = np.asarray(img, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: not a readable image ({exc})") from None
    pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], channels)
    if prep.bgr:
        pixels = pixels[:, :, ::-1]
    for what, values in (("mean", prep.mean), ("std", prep.std)):
        if len(values) not in (1, channels):
            raise OptionError(
                f"{_FLAG}: {what} has {len(values)} values, input {name!r} has {channels} channels"
            )
    mean = np.asarray(prep.mean, dtype=np.float32)
    std = np.asarray(prep.std, dtype=np.float32)
    x = (pixels * np.float32(prep.scale) - mean) / std
    if layout == "NCHW":
        x = x.transpose(2, 0, 1)
    if len(shape) == 4:
        x = x[None]
    want = tuple(shape)
    if any(isinstance(w, int) and w != d for w, d in zip(want, x.shape, strict=True)):
        raise InputShapeError(
            f"{path}: image gives input {name!r} shape {list(x.shape)}, model expects "
            f"{list(want)}; add {_FLAG} resize=HxW"
        )
    return np.ascontiguousarray(x).astype(t.dtype.numpy, copy=False)
