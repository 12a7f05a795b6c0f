"""The one scheduler of timed windows: who times the next window, which windows count, when to stop.

Every timed process feeds it: a model trial (one candidate), a side-by-side process of the model path (several),
a script's process alone or side by side. Each round times one window of every live candidate in rotating order
(A B C, B C A, C A B, ...; one candidate: a window a round), so the windows of a round see the same machine and
are paired. A round in which any candidate compiled is dropped for every candidate (rounds stay aligned; its
time is that candidate's re-warm, counted as compile), and a candidate that compiles in more than
``policy.rewarm_windows`` windows fails. A window the process was descheduled in (its CPU seconds far below its
wall seconds, :func:`autocompile.trial.timing.stats.descheduled`) does not count towards a side-by-side minimum.

Pure: no clock, no torch. Drivers time each window with :class:`autocompile.trial.timing.clock.WindowClock` and
record every rank's largest values (:mod:`autocompile.trial.timing.ranks`), so every rank decides alike with no
broadcast. Standard library only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TypeVar

from autocompile.config.window_policy import WindowPolicy
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.stats import clean_rounds, descheduled, relative_half_width, t975

T = TypeVar("T")
LOSSES_KEPT = 64
"""Per-step losses kept per candidate side by side (the numerics check reads the first few dozen)."""


def rotate(items: list[T], r: int) -> list[T]:
    """``items`` rotated left by ``r`` (the order of round ``r``)."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


@dataclass
class Window:
    """One timed window of one candidate: every rank's largest values."""

    seconds: float
    cpu_s: float
    """The process's CPU seconds over it: a descheduled window has far fewer than its wall seconds."""
    compiled: bool = False
    """Frames compiled or CUDA graphs recorded in it: warm-up after all."""
    items: int = 0
    """Items (tokens, samples) it trained on, every rank's."""


@dataclass
class Candidate:
    """One candidate's windows so far."""

    step_s: list[float] = field(default_factory=list)
    """Seconds per step of each kept window, in order."""
    cpu_s: list[float] = field(default_factory=list)
    """CPU seconds per step of each kept window."""
    items: list[int] = field(default_factory=list)
    compiled: int = 0
    """Windows it compiled in."""
    rewarm_s: float = 0.0
    """Seconds of its windows in dropped rounds: warm-up after all."""
    rewarm_steps: int = 0
    failed: bool = False


class Rounds:
    """The rounds of one timed process: :meth:`next_round`, time each member's window, :meth:`record`, :meth:`more`."""

    def __init__(self, candidates: list[int], policy: WindowPolicy, shift: int = 0, side_by_side: bool = False) -> None:
        self.policy, self.shift = policy, shift
        self.of = {i: Candidate() for i in candidates}
        self.alone = not side_by_side
        """One candidate: a window a round, its own interval decides; side by side, two at least are compared."""
        self.started = 0
        """Rounds begun, dropped ones included (the rotation's index)."""
        self.timed = 0.0
        """Seconds of every window timed, dropped ones included."""

    @property
    def live(self) -> list[int]:
        return [i for i in sorted(self.of) if not self.of[i].failed]

    def next_round(self) -> list[int]:
        """The members of the next round, in their order; empty when too few candidates are left to compare."""
        live = self.live
        if len(live) < (1 if self.alone else 2):
            return []
        self.started += 1
        return rotate(live, self.started - 1 + self.shift)

    def record(self, windows: dict[int, Window]) -> list[int]:
        """A round's windows, by candidate; returns those that failed by it (compiled in too many windows)."""
        n = self.policy.window_steps
        self.timed += sum(w.seconds for w in windows.values())
        dropped = any(w.compiled for w in windows.values())
        failed = []
        for i, w in windows.items():
            c = self.of[i]
            if w.compiled:
                c.compiled += 1
                if c.compiled > self.policy.rewarm_windows and not c.failed:
                    c.failed = True
                    failed.append(i)
            if dropped:
                c.rewarm_s += w.seconds
                c.rewarm_steps += n
            else:
                c.step_s.append(w.seconds / n)
                c.cpu_s.append(w.cpu_s / n)
                c.items.append(w.items)
        return failed

    @property
    def kept(self) -> int:
        """Kept windows of the live candidate with the most (a side-by-side result's ``rounds``)."""
        return max((len(self.of[i].step_s) for i in self.live), default=0)

    def clean(self) -> int:
        """Rounds that count: side by side, those every live candidate timed and none was descheduled in (a pair
        needs both windows); alone, every kept window (its median reads through a stall, and a trial's windows
        stay as many as asked)."""
        series = [self.of[i] for i in self.live if self.of[i].step_s]
        if not series or self.alone:
            return len(series[0].step_s) if series else 0
        return len(clean_rounds(*(c.step_s for c in series), cpu=[c.cpu_s for c in series]))

    def more(self) -> bool:
        """Another round? The minimum of clean rounds (never forever: dropped and descheduled rounds may delay
        it up to three times ``max_timed_s``), then until :meth:`half_width` is within ``precision`` or
        ``max_timed_s`` is spent."""
        p = self.policy
        if len(self.live) < (1 if self.alone else 2):
            return False
        if self.clean() < p.min_rounds:
            return self.started < p.min_rounds or self.timed < p.max_timed_s * 3
        if not p.precision or self.timed >= p.max_timed_s:
            return False
        return self.half_width() > p.precision

    def half_width(self) -> float:
        """Alone: the relative 95 % half-width of the mean of its windows; side by side, the widest of any
        candidate's paired interval against the fastest (:func:`worst_half_width`)."""
        live = [self.of[i] for i in self.live]
        if self.alone:
            return relative_half_width(live[0].step_s)
        return worst_half_width([c.step_s for c in live], [c.cpu_s for c in live])


def worst_half_width(windows: list[list[float]], cpu: list[list[float]] | None = None) -> float:
    """The widest 95% half-width (of the mean log-ratio, about relative) of any candidate against the
    fastest, over the rounds they share (``cpu``: each candidate's windows' CPU seconds, aligned)."""
    cpus = cpu if cpu is not None else [None] * len(windows)
    pairs = [(w, c) for w, c in zip(windows, cpus, strict=True) if w]
    series = [w for w, _ in pairs]
    if len(series) < 2:
        return 0.0
    rounds = clean_rounds(*series, cpu=[c for _, c in pairs])
    n = len(rounds)
    if n < 2:
        return math.inf
    logs = [[math.log(w[r]) for r in rounds] for w in series]
    leader = min(logs, key=statistics.fmean)
    return max(t975(n - 1) * statistics.stdev(a - b for a, b in zip(other, leader, strict=True)) / math.sqrt(n)
               for other in logs if other is not leader)


def set_side_timing(result: TrialResult, c: Candidate) -> None:
    """A side-by-side candidate's timing fields: its windows, and its step time, the geometric mean of the
    windows the process was not descheduled in (how many were left out: ``stalled_windows``)."""
    out = descheduled(c.step_s, c.cpu_s)
    kept = [s for k, s in enumerate(c.step_s) if k not in out]
    result.step_s_windows, result.step_cpu_s_windows = c.step_s, c.cpu_s
    result.step_s = math.exp(statistics.fmean(math.log(s) for s in kept)) if kept else None
    result.stalled_windows = len(c.step_s) - len(kept)


def set_timing(result: TrialResult, c: Candidate, warm_s: list[float], warmup: int, window_steps: int,
               world_size: int, count_items: bool = True) -> None:
    """A one-candidate process's timing fields, from its warm-up steps' seconds (``warmup`` steps) and its
    windows: the median step; compile time as the warm-up's (and the re-warmed windows') excess over as many
    steady-state steps; throughput per window, every rank's items (``count_items`` False: optimizer steps)."""
    window_s = [s * window_steps for s in c.step_s]
    median = statistics.median(c.step_s)
    result.compile_s = max(0.0, sum(warm_s) + c.rewarm_s - (warmup + c.rewarm_steps) * median)
    result.first_step_s, result.warmup_step_s = warm_s[0], warm_s
    result.step_s, result.step_s_windows, result.step_cpu_s_windows = median, c.step_s, c.cpu_s
    result.step_s_cv = statistics.pstdev(c.step_s) / statistics.fmean(c.step_s)
    # Half-width of the 95% interval of the mean window step time, relative (inside this process).
    result.timed_precision = relative_half_width(c.step_s) if len(c.step_s) > 1 else None
    result.timed_s, result.windows = sum(window_s), len(window_s)
    rates = [(n * world_size if count_items else window_steps) / t for n, t in zip(c.items, window_s, strict=True)]
    result.tokens_per_s, result.tokens_per_s_windows = statistics.median(rates), rates
    result.rewarm_steps, result.warmup_steps = c.rewarm_steps, warmup + c.rewarm_steps
    result.window_steps = window_steps
