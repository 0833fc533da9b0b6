"""Post-training calibration: methods, per-tensor observers, calibration data and progress.

Typical use::

    method = parse_calib_method("percentile=99.99")
    samples = load_calibration(path, graph_input_types, count=16)
    observers = {name: make_observer(method) for name in tensors}
    for p in range(method.passes):
        for feed in samples:
            for name, value in run_model(feed).items():
                observers[name].update(value)
        if p + 1 < method.passes:
            for obs in observers.values():
                obs.next_pass()
    rmin, rmax = observers[name].range(symmetric=False)
"""

from __future__ import annotations

from compiler.calibration.dataset import Preprocess, load_calibration, parse_preprocess
from compiler.calibration.methods import CalibMethod, parse_calib_method
from compiler.calibration.observers import (
    HistogramObserver,
    MinMaxObserver,
    Observer,
    channel_minmax,
    make_observer,
    quantizer_range,
)
from compiler.calibration.progress import Progress
from compiler.calibration.qparams import compute_scale_zero_point, qrange

__all__ = [
    "CalibMethod",
    "parse_calib_method",
    "Observer",
    "MinMaxObserver",
    "HistogramObserver",
    "make_observer",
    "channel_minmax",
    "quantizer_range",
    "compute_scale_zero_point",
    "qrange",
    "load_calibration",
    "Preprocess",
    "parse_preprocess",
    "Progress",
]
