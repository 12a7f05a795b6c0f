"""What a trial process needs of statistics: a mean's t-interval and the windows a process was not running.

Standard library only: the worker uses :func:`relative_half_width` to decide when its timed part
is long enough, and it runs where nothing but PyTorch is installed. The 97.5% quantiles of
Student's t are tabulated (they agree with ``scipy.stats.t.ppf`` to 3 decimals; a test checks).
The study's ratios, noise floors and speed changes build on these (:mod:`autocompile.study.statistics`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (two-sided 95% interval)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher beyond the table: within 0.001 of the exact value for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def relative_half_width(values: Sequence[float]) -> float:
    """Half-width of the 95% t-interval of the mean of ``values``, relative to the mean (inf below 2)."""
    if len(values) < 2:
        return math.inf
    mean = statistics.fmean(values)
    return t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) / mean


STALL = 1.5
"""A window slower than this many times its candidate's median window in the same process is a stall:
the process was not running (on the 2-core VM, another job took the cores: windows 30x slower were
seen), not a property of the program, whose windows vary by 2-4 %."""


def stalled(windows: Sequence[float]) -> set[int]:
    """Indices of the stalled windows of one candidate in one process."""
    if len(windows) < 3:
        return set()
    median = statistics.median(windows)
    return {i for i, w in enumerate(windows) if w > STALL * median}


def descheduled(wall: Sequence[float], cpu: Sequence[float] | None) -> set[int]:
    """Indices of the windows of one candidate in one process during which the process was not running.

    With the process CPU seconds of each window (``time.process_time()`` deltas beside the wall-clock
    ones): a window whose wall time exceeds ``STALL`` x what its CPU time accounts for at the candidate's
    typical CPU/wall ratio (the median) waited for the cores; a window that is slow because the program
    did more work grew its CPU time with its wall time, and is kept (it is the program's own). Without CPU
    times (or with unusable ones) the wall-clock rule :func:`stalled` stands in."""
    if cpu is None or len(cpu) != len(wall) or len(wall) < 3 or any(w <= 0 for w in wall):
        return stalled(wall)
    ratios = [c / w for c, w in zip(cpu, wall, strict=True)]
    typical = statistics.median(ratios)
    if typical <= 0:
        return stalled(wall)
    return {i for i, r in enumerate(ratios) if r * STALL < typical}


def clean_rounds(*series: Sequence[float], cpu: Sequence[Sequence[float] | None] | None = None) -> list[int]:
    """The rounds (indices shared by every series) in which no series stalled (``cpu``: each series' CPU
    seconds per window, for :func:`descheduled`; None: the wall-clock rule)."""
    n = min(map(len, series), default=0)
    cpus = list(cpu) if cpu is not None else [None] * len(series)
    dropped = set().union(*(descheduled(s[:n], c[:n] if c is not None else None)
                            for s, c in zip(series, cpus, strict=True))) if series else set()
    return [r for r in range(n) if r not in dropped]
