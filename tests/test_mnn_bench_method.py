"""The timing method of ``benchmarks/mnn_vs_converter.py`` (issue 5): interleaving and paired ratios.

* every round runs each file exactly once; over 2n rounds each of n files runs first, and last,
  equally often, and no file always follows the same neighbour;
* the ratio is the median of per-round ratios, with its 25th-75th percentiles.
"""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.mnn_vs_converter import paired_ratio, round_orders

KEYS = ["kiln fp32", "conv fp32", "kiln int8", "kiln int8*", "conv int8"]


def test_round_orders_balance_positions() -> None:
    orders = round_orders(KEYS, 2 * len(KEYS))
    assert all(sorted(o) == sorted(KEYS) for o in orders)
    firsts, lasts = Counter(o[0] for o in orders), Counter(o[-1] for o in orders)
    assert set(firsts.values()) == {2} and set(lasts.values()) == {2}
    after = {k: {o[o.index(k) - 1] for o in orders if o.index(k) > 0} for k in KEYS}
    assert all(len(v) >= 2 for v in after.values()), after


def test_paired_ratio_is_median_of_round_ratios() -> None:
    num = [1.0, 2.0, 3.0, 4.0, 10.0]
    den = [1.0, 1.0, 2.0, 4.0, 5.0]  # ratios 1, 2, 1.5, 1, 2
    mid, lo, hi = paired_ratio(num, den)
    assert mid == pytest.approx(1.5) and lo == pytest.approx(1.0) and hi == pytest.approx(2.0)
    assert paired_ratio([2.0], [4.0]) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
