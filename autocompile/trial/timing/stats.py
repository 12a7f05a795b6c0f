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


SHIFT_SDS = 3.0
"""A change of speed: the two segments' mean log windows differ by more than this many within-segment sds
(on stationary noise, fewer than 1 % of series of 6-40 windows pass it: tests/test_change_point.py)..."""
SHIFT_MIN = 0.10
"""... and by more than this share of the step time: a smaller drift (windows of a quiet process drift by
2-4 % as caches and clocks settle) is no change of speed a user's answer depends on."""
SEGMENT_MIN = 3
"""Windows on each side of a change at least: one or two slow windows are a stall, not a level."""


@dataclass(frozen=True)
class ChangePoint:
    """A sustained level shift in one candidate's windows within one process: windows ``at`` onwards ran at
    another speed than those before."""

    at: int
    """Index of the first window at the new speed."""
    before_s: float
    """Geometric mean seconds of the windows before ``at`` and from ``at`` on."""
    after_s: float
    sds: float
    """The shift of mean log window in within-segment sds (``SHIFT_SDS`` at least)."""
    cpu_kept_pace: bool | None = None
    """CPU seconds grew with wall seconds across the change (the program's own work: it did more, or ran its
    work slower on the cores it had); False: the process waited for the cores; None without CPU times."""

    @property
    def change(self) -> float:
        return self.after_s / self.before_s - 1

    def text(self, who: str, where: str, scale: float = 1e3, unit: str = "ms") -> str:
        """``X changed speed within process P at window k (from a to b ms, ...)``, one line (``where``:
        ``process P``)."""
        why = {True: "; CPU time moved with it: the program's work or the machine's speed, not a wait for the cores",
               False: "; CPU time did not: the process waited for the cores", None: ""}[self.cpu_kept_pace]
        return (f"{who} changed speed within {where} at window {self.at} (from "
                f"{self.before_s * scale:.2f} to {self.after_s * scale:.2f} {unit}, {self.change:+.0%}{why})")


def change_point(windows: Sequence[float], cpu: Sequence[float] | None = None) -> ChangePoint | None:
    """The one split of a window sequence into two levels, if it passes the rule; None on stationary windows.

    Rule (binary segmentation with one split): on log window times, the split ``k`` (both segments at least
    :data:`SEGMENT_MIN` windows) that removes the most squared deviation from the overall mean; a change when
    the segments' means differ by more than :data:`SHIFT_SDS` pooled within-segment sds and by more than
    :data:`SHIFT_MIN` relative. A lone stall inflates the within-segment sd as much as the mean, so it does not
    pass; a run of stalls is a level (with ``cpu``, the CPU/wall ratio across the split says which)."""
    if len(windows) < 2 * SEGMENT_MIN or min(windows) <= 0:
        return None
    logs = [math.log(w) for w in windows]
    n = len(logs)
    best: tuple[float, int] | None = None
    for k in range(SEGMENT_MIN, n - SEGMENT_MIN + 1):
        gain = k * (n - k) / n * (statistics.fmean(logs[:k]) - statistics.fmean(logs[k:])) ** 2
        if best is None or gain > best[0]:
            best = (gain, k)
    assert best is not None
    k = best[1]
    m1, m2 = statistics.fmean(logs[:k]), statistics.fmean(logs[k:])
    ss = sum((x - m1) ** 2 for x in logs[:k]) + sum((x - m2) ** 2 for x in logs[k:])
    sd = math.sqrt(ss / (n - 2))
    shift = abs(m2 - m1)
    if shift <= math.log1p(SHIFT_MIN) or shift <= SHIFT_SDS * sd:
        return None
    kept: bool | None = None
    if cpu is not None and len(cpu) == n and min(cpu) > 0:
        ratio = [c / w for c, w in zip(cpu, windows, strict=True)]
        before, after = statistics.median(ratio[:k]), statistics.median(ratio[k:])
        # The descheduled rule's margin, either way: the slow side's CPU/wall ratio is not STALL x under the fast
        # side's (a speed-up can end a descheduled stretch as a slow-down can start one).
        slow, fast = (after, before) if m2 > m1 else (before, after)
        kept = slow * STALL >= fast
    return ChangePoint(k, math.exp(m1), math.exp(m2), shift / sd if sd > 0 else math.inf, kept)
