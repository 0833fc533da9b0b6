"""A horizontal bar chart rasterized with numpy and encoded as PNG by hand (no matplotlib).

The image is an RGB uint8 array: one bar per layer (length = SQNR on a linear dB axis
from 0 to ``x_max``, clipped), the layer name on the left and the value on the right in a
3x5 pixel block font scaled 2x, a vertical line at the ``--min-sqnr`` threshold, and tick
labels every 10 dB. PNG: signature, IHDR (8-bit RGB, no interlace), one IDAT holding
zlib(level 9) of every row prefixed by filter byte 0, IEND; each chunk is
length (big-endian u32) + type + data + CRC-32(type + data). Same input, same bytes.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Bar", "bar_chart", "encode_png", "text_image", "COLORS"]

_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001010010",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    "_": "000000000000111", "-": "000000111000000", ".": "000000000000010", "/": "001001010100100",
    ":": "000010000010000", "@": "010101111100011", " ": "000000000000000", "?": "111001010000010",
    "+": "000010111010000", "(": "001010010010001", ")": "100010010010100", "=": "000111000111000",
    "#": "101111101111101", ">": "100010001010100", "<": "001010100010001",
}  # fmt: skip
_SCALE = 2
_ADVANCE = 4 * _SCALE  # glyph 3 wide + 1 space
_GLYPH_H = 5 * _SCALE
_ROW = 16
_BAR = 10
_MARGIN = 8
_PLOT_W = 480
_MAX_CHARS = 24

COLORS = {
    "background": (255, 255, 255),
    "text": (20, 20, 20),
    "axis": (120, 120, 120),
    "grid": (225, 225, 225),
    "int8": (70, 130, 180),
    "float": (230, 120, 30),
    "threshold": (200, 0, 0),
}


@dataclass(frozen=True)
class Bar:
    """One bar: its label, value (dB) and whether it is drawn in the highlight colour."""

    label: str
    value: float
    highlight: bool = False


def _glyph(ch: str) -> np.ndarray:
    bits = _GLYPHS.get(ch.upper(), _GLYPHS["?"])
    small = np.array([b == "1" for b in bits], dtype=bool).reshape(5, 3)
    return np.kron(small, np.ones((_SCALE, _SCALE), dtype=bool)).astype(bool)


def text_image(text: str) -> np.ndarray:
    """A boolean mask (ink = True) of ``text`` in the block font."""
    mask = np.zeros((_GLYPH_H, max(1, len(text) * _ADVANCE)), dtype=bool)
    for i, ch in enumerate(text):
        mask[:, i * _ADVANCE : i * _ADVANCE + 3 * _SCALE] = _glyph(ch)
    return mask


def _draw_text(img: np.ndarray, text: str, x: int, y: int, color: tuple[int, int, int]) -> None:
    mask = text_image(text)
    h, w = mask.shape
    h, w = min(h, img.shape[0] - y), min(w, img.shape[1] - x)
    if h > 0 and w > 0:
        img[y : y + h, x : x + w][mask[:h, :w]] = color


def _short(label: str) -> str:
    return label if len(label) <= _MAX_CHARS else label[: _MAX_CHARS - 2] + ".."


def bar_chart(bars: Sequence[Bar], threshold: float | None = None, x_max: float | None = None) -> np.ndarray:
    """The chart as an RGB uint8 image (see the module docstring)."""
    finite = [b.value for b in bars if math.isfinite(b.value) and b.value < 900.0]
    top = max([*finite, threshold or 0.0, 10.0])
    x_max = x_max if x_max is not None else 10.0 * math.ceil(top / 10.0 + 0.5)
    label_w = _ADVANCE * max([len(_short(b.label)) for b in bars] + [4]) + _MARGIN
    value_w = _ADVANCE * 6 + _MARGIN
    x0 = _MARGIN + label_w
    width = x0 + _PLOT_W + value_w
    plot_h = _ROW * max(len(bars), 1)
    y0 = _MARGIN
    height = y0 + plot_h + 4 + _GLYPH_H + 2 * _MARGIN
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[:] = COLORS["background"]

    def px(v: float) -> int:
        return int(round(min(max(v, 0.0), x_max) / x_max * _PLOT_W))

    for tick in range(0, int(x_max) + 1, 10):
        x = x0 + px(float(tick))
        img[y0 : y0 + plot_h, x] = COLORS["grid"]
        img[y0 + plot_h : y0 + plot_h + 4, x] = COLORS["axis"]
        label = str(tick)
        _draw_text(img, label, max(0, x - len(label) * _ADVANCE // 2), y0 + plot_h + 6, COLORS["text"])
    for i, b in enumerate(bars):
        y = y0 + i * _ROW + (_ROW - _BAR) // 2
        _draw_text(img, _short(b.label), _MARGIN, y, COLORS["text"])
        length = px(b.value) if math.isfinite(b.value) else (_PLOT_W if b.value > 0 else 0)
        img[y : y + _BAR, x0 : x0 + length] = COLORS["float" if b.highlight else "int8"]
        shown = "999+" if b.value >= 900.0 else f"{b.value:.1f}"
        _draw_text(img, shown, x0 + length + 4, y, COLORS["text"])
    img[y0 : y0 + plot_h + 1, x0] = COLORS["axis"]
    img[y0 + plot_h, x0 : x0 + _PLOT_W + 1] = COLORS["axis"]
    if threshold is not None and math.isfinite(threshold):
        x = x0 + px(threshold)
        img[y0 : y0 + plot_h, max(x0, x - 1) : x + 1] = COLORS["threshold"]
    return img


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(img: np.ndarray) -> bytes:
    """PNG bytes of an HxWx3 (RGB) or HxW (gray) uint8 image: filter 0 rows, zlib level 9."""
    arr = np.ascontiguousarray(img, dtype=np.uint8)
    if arr.ndim == 2:
        color_type, channels = 0, 1
    elif arr.ndim == 3 and arr.shape[2] == 3:
        color_type, channels = 2, 3
    else:
        raise ValueError(f"encode_png: expected HxW or HxWx3 uint8, got shape {arr.shape}")
    h, w = arr.shape[:2]
    rows = np.zeros((h, 1 + w * channels), dtype=np.uint8)
    rows[:, 1:] = arr.reshape(h, w * channels)
    header = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
        + _chunk(b"IEND", b"")
    )
