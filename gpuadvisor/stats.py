"""Small statistics shared by the timing, the reports and the gate."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(samples: Iterable, q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method) of the finite numbers in ``samples``;
    None when there are none. Values that are not numbers (None, NaN, strings) are left out."""
    values = []
    for s in samples:
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            try:
                s = float(s)  # numpy scalars, numeric strings
            except (TypeError, ValueError):
                continue
        if math.isfinite(s):
            values.append(float(s))
    if not values:
        return None
    values.sort()
    position = (len(values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)
