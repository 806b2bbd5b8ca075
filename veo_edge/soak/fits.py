"""The soak's statistics: percentiles of a latency histogram, and the Theil–Sen slope of a series against
time with its 95 % confidence interval (``scipy.stats.theilslopes``), fitted on bin medians when the
series is long."""

from __future__ import annotations

from typing import Any

MIN_FIT_SAMPLES = 8
#: the jitter (a half-range of window medians) needs this many windows; fewer reads as skipped
MIN_JITTER_WINDOWS = 2
#: Theil–Sen is O(n²): longer series are fitted on this many points (medians of equal-count bins)
MAX_FIT_POINTS = 1000


def percentiles(h) -> dict[str, float] | None:
    if h.get_total_count() == 0:
        return None
    ms = 1e-3
    return {
        "count": h.get_total_count(),
        "p50": h.get_value_at_percentile(50.0) * ms,
        "p90": h.get_value_at_percentile(90.0) * ms,
        "p99": h.get_value_at_percentile(99.0) * ms,
        "p999": h.get_value_at_percentile(99.9) * ms,
        "max": h.get_max_value() * ms,
        "min": h.get_min_value() * ms,
        "mean": h.get_mean_value() * ms,
    }


def theil_sen(ts: list[float], ys: list[float]) -> dict[str, Any] | None:
    """Theil–Sen slope (per hour) with its 95 % interval; on bin medians above ``MAX_FIT_POINTS``."""
    if len(ts) < MIN_FIT_SAMPLES or max(ts) - min(ts) <= 0:
        return None
    import numpy as np
    from scipy.stats import theilslopes

    t, y = np.asarray(ts, dtype=float), np.asarray(ys, dtype=float)
    if len(t) > MAX_FIT_POINTS:
        bins = np.array_split(np.arange(len(t)), MAX_FIT_POINTS)
        t = np.array([np.median(t[b]) for b in bins])
        y = np.array([np.median(y[b]) for b in bins])
    slope, intercept, low, high = theilslopes(y, t / 3600.0, alpha=0.95)
    return {
        "bytes_per_hour": float(slope),
        "low": float(low),
        "high": float(high),
        "intercept": float(intercept),
        "samples": len(ts),
        "fit_points": len(t),
        "span_s": max(ts) - min(ts),
    }
