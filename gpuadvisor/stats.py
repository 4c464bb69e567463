"""Small statistics shared by the timing, the reports and the gate."""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Iterable
from typing import Any

# The speedup's confidence interval (apply). 2000 resamples: the interval's ends move by well under 1% between
# seeds for 100 samples a side.
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the same samples give the same interval
# The paired speedup (per-round ratios) needs this many rounds for its interval: a bootstrap of a median over
# fewer resamples a handful of values.
MIN_PAIRED_ROUNDS = 6


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


def finite_round(value, digits: int = 2):
    """``value`` rounded to ``digits`` as a float; None and bools as they are; anything else that is not a finite
    number (NaN, inf, a string) gives None: what a report holds for a figure it could not measure."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return round(float(value), digits)
    return None


def _ratio_of_medians(before, after, axis=-1):
    import numpy as np

    return np.median(before, axis=axis) / np.median(after, axis=axis)


def _percentile_interval(samples: tuple, statistic, fallback: float, confidence: float, resamples: int, seed: int):
    """(low, high, by_scipy): the percentile-bootstrap interval of ``statistic`` (vectorized, ``axis`` keyword)
    over ``samples``, each resampled on its own, with a fixed seed; SciPy's bootstrap, NumPy's resampling when
    SciPy is missing. A degenerate resample distribution (identical samples) gives ``fallback`` at both ends."""
    import numpy as np

    try:
        from scipy import stats
    except ImportError:
        rng = np.random.default_rng(seed)
        values = statistic(*(rng.choice(x, (resamples, len(x))) for x in samples), axis=1)
        low, high = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
        return float(low), float(high), False
    seed_kw = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # a degenerate resample distribution is fine here
        interval = stats.bootstrap(
            samples,
            statistic,
            vectorized=True,
            paired=False,
            confidence_level=confidence,
            n_resamples=resamples,
            method="percentile",
            **{seed_kw: np.random.default_rng(seed)},
        ).confidence_interval
    low, high = float(interval.low), float(interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        low = high = fallback
    return low, high, True


def speedup_interval(
    before_us: list[float],
    after_us: list[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """median(before) / median(after) and its percentile-bootstrap confidence interval.

    Each side's per-step samples are resampled on their own (they are two samples, not pairs), ``resamples``
    times, with a fixed seed. Returns {median, ci_low, ci_high, confidence, method}; the interval is None with
    fewer than 2 samples a side.
    """
    import numpy as np

    before = np.asarray([x for x in before_us if x is not None], dtype=float)
    after = np.asarray([x for x in after_us if x is not None], dtype=float)
    result: dict[str, Any] = {"median": None, "ci_low": None, "ci_high": None, "confidence": confidence}
    if not len(before) or not len(after) or np.median(after) <= 0:
        result["method"] = "no samples"
        return result
    result["median"] = float(_ratio_of_medians(before, after))
    if len(before) < 2 or len(after) < 2:
        result["method"] = "no interval: fewer than 2 samples a side"
        return result
    what = (
        f"{100 * confidence:g}% percentile bootstrap of median(before)/median(after) over the per-step samples "
        f"({len(before)} before, {len(after)} after; each side resampled on its own, "
        f"{resamples} resamples, seed {seed})"
    )
    low, high, by_scipy = _percentile_interval(
        (before, after), _ratio_of_medians, result["median"], confidence, resamples, seed
    )
    method = what + " (scipy.stats.bootstrap)" if by_scipy else what.replace("95%", "95% NumPy") + "; SciPy missing"
    result.update(ci_low=low, ci_high=high, method=method)
    return result


def paired_speedup(
    before_rounds_us: list[float | None],
    after_rounds_us: list[float | None],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any] | None:
    """The median of the per-round ratios before / after (each round's two blocks run back to back) and its
    percentile-bootstrap interval over the rounds; None with fewer than MIN_PAIRED_ROUNDS usable rounds.

    Pooling every step of a side (:func:`speedup_interval`) compares steps timed minutes apart; when the host's
    speed drifts between rounds (a shared vCPU that runs slower for seconds at a time) the pooled medians mix
    those speeds and the interval widens with them. A ratio within a round cancels any drift slower than the
    round, so with many short rounds this is the tighter and steadier figure."""
    import numpy as np

    ratios = np.asarray(
        [b / a for b, a in zip(before_rounds_us, after_rounds_us) if b and a and b > 0 and a > 0], dtype=float
    )
    ratios = ratios[np.isfinite(ratios)]
    if len(ratios) < MIN_PAIRED_ROUNDS:
        return None
    median = float(np.median(ratios))
    low, high, _ = _percentile_interval((ratios,), np.median, median, confidence, resamples, seed)
    return {
        "median": median,
        "ci_low": low,
        "ci_high": high,
        "rounds": len(ratios),
        "method": (
            f"median of the {len(ratios)} per-round ratios median(before block) / median(after block); "
            f"{100 * confidence:g}% percentile bootstrap over the rounds ({resamples} resamples, seed {seed})"
        ),
    }
