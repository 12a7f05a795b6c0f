"""The machine's noise as the study reads it: run-to-run noise pooled over configurations measured more than
once, and a sustained change of speed within one process (a candidate's windows at two levels).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autocompile.trial.timing.stats import STALL


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
