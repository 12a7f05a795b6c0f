"""Intervals for noisy timings: a mean's t-interval, paired log-ratios over rounds, a pooled noise floor.

Standard library only: the worker uses :func:`relative_half_width` to decide when its timed part
is long enough, and it runs where nothing but PyTorch is installed. The 97.5% quantiles of
Student's t are tabulated (they agree with ``scipy.stats.t.ppf`` to 3 decimals; a test checks).

Why log-ratios: step times are positive and their noise is multiplicative (a busy neighbour slows
every step by some factor), so ``log(a / b)`` is close to symmetric and its mean over rounds,
exponentiated, is a ratio a user reads ("+3.1 %"). Pairing by round cancels what a round shares:
candidates measured back to back in one round saw the same machine state.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Ratio:
    """A ratio ``a / b`` estimated over paired rounds, as a relative change with its 95% interval."""

    change: float
    """exp(mean log ratio) - 1: +0.05 = a is 5% slower than b."""
    low: float | None
    """Lower end of the 95% interval of ``change``; None with fewer than two rounds."""
    high: float | None
    rounds: int

    @property
    def measurable(self) -> bool:
        """The interval excludes zero: a difference the repeats can tell from noise."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def text(self) -> str:
        """``+0.3 % [95 % CI -1.1, +1.7]``."""
        if self.low is None or self.high is None:
            return f"{self.change:+.1%} (1 round: no interval)"
        return f"{self.change:+.1%} [95% CI {self.low * 100:+.1f}, {self.high * 100:+.1f}]"

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return {"change": self.change, "low": self.low, "high": self.high, "rounds": self.rounds,
                "measurable": self.measurable}


def paired_ratio(a: Mapping[int, float], b: Mapping[int, float]) -> Ratio | None:
    """``a / b`` over the rounds both measured (round -> value); None when they share no round."""
    logs = [math.log(a[r] / b[r]) for r in sorted(a.keys() & b.keys()) if a[r] > 0 and b[r] > 0]
    if not logs:
        return None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(math.expm1(mean), None, None, 1)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Ratio(math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half), len(logs))


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise: the relative standard deviation of one configuration's step time across
    fresh processes, pooled over every configuration measured more than once."""

    rel_sd: float
    df: int
    """Degrees of freedom of the pooled estimate (measurements minus configurations)."""
    source: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {"rel_sd": self.rel_sd, "df": self.df, "source": self.source}


def pooled_noise(groups: Iterable[Sequence[float]], source: str) -> Noise | None:
    """Pooled sd of log step time within groups of the same configuration; None without a repeat."""
    ss, df = 0.0, 0
    for values in groups:
        logs = [math.log(v) for v in values if v > 0]
        if len(logs) < 2:
            continue
        mean = statistics.fmean(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
    if df == 0:
        return None
    return Noise(math.sqrt(ss / df), df, source)


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
