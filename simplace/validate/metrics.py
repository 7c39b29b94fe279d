"""Agreement of predicted and measured step times: error and rank metrics, and how they
print."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fmt_pct", "fmt_tau", "kendall_tau", "mape"]


def mape(predicted_s, measured_s) -> float:
    """Mean absolute percentage error of predictions, as a fraction (0.1 = 10%)."""
    p, m = np.asarray(predicted_s, float), np.asarray(measured_s, float)
    if p.size == 0:
        return math.nan
    return float(np.mean(np.abs(p - m) / m))


def kendall_tau(predicted_s, measured_s) -> float:
    """Kendall's tau-b between predicted and measured times: 1 when the simulator ranks
    the candidates as the hardware does; NaN for fewer than two candidates or ties only."""
    from scipy.stats import kendalltau

    p, m = np.asarray(predicted_s, float), np.asarray(measured_s, float)
    if p.size < 2 or np.all(p == p[0]) or np.all(m == m[0]):
        return math.nan
    return float(kendalltau(p, m).statistic)


def fmt_tau(t: float | None) -> str:
    """A Kendall tau for tables: two decimals, ``n/a`` for None or NaN."""
    return "n/a" if t is None or math.isnan(t) else f"{t:.2f}"


def fmt_pct(x: float | None) -> str:
    """A fraction as a percentage for tables (0.123 -> ``12.3%``), ``n/a`` for None or
    NaN."""
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"
