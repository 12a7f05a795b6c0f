"""The study's decision rules under noise, as pure functions of intervals (DESIGN.md section 10).

- **Ties** are equivalence, not "the interval contains zero": a candidate ties with the leader when its
  95% interval lies within +-``study.tie_margin`` (two one-sided tests at 2.5% each); one whose interval
  straddles the margin is *undetermined*, with the number of further processes that would decide it.
- **Pruning** allows for the noise of both sides and for the best being the minimum of ``k`` noisy
  values (it is lucky by about ``E[max of k N(0,1)]`` standard deviations).
- **Verdicts** are a family: Holm's step-down keeps the chance of one or more false "measurably" at
  5% whatever the number of neighbours and however their comparisons with one winner correlate. Side by
  side they are read twice (:func:`first_look`): a neighbour decided after half the processes leaves the
  rest, the 5% split between the looks (``LOOK_ALPHAS``).

Every rule works on the log scale, where the intervals of :mod:`autocompile.study.statistics.intervals` and
:mod:`autocompile.study.statistics.intervals` are symmetric.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy import special

from autocompile.study.statistics.intervals import Ratio

ALPHA = 0.05
"""Two-sided level of every interval, family-wise level of the verdicts."""
PRUNE_ALPHA = 0.05
"""One-sided chance of pruning a configuration no worse than the best, allowed per pruning decision."""
PRIOR_ALONE_NOISE = 0.086
"""Relative sd of one program's step time across alone fresh processes, until the study measures it: the
largest the studies of issue 26 recorded (6.7-8.6 % on the 2-core VM)."""
PRUNE_WINDOWS = 3
"""Timed windows a challenger shows before the prune rule reads it (their median): one window can be a stall
(the 2-core VM showed a first window at 2x the warm-up steps before it and the windows after)."""
POWER = 0.8
"""The chance of deciding that :func:`processes_to_decide` plans for."""
MAX_MORE = 1000
"""Beyond this many further processes an undetermined comparison is called undecidable in practice."""
LOOK_ALPHAS = (0.01, 0.04)
"""Family-wise level spent at the verdict phase's two looks (:func:`first_look`, then its end): their sum is
``ALPHA`` (a union bound, whatever the correlation of the looks), most of it kept for the end, where the small
effects are decided; 1 % at the first look still decides the large ones (eager beside compiled, fp32 beside
bf16) from 4 processes."""


@dataclass(frozen=True)
class LogInterval:
    """A ratio's estimate on the log scale: centre, 95% half-width, degrees of freedom."""

    mu: float
    half: float
    df: float

    @property
    def se(self) -> float:
        return self.half / float(special.stdtrit(self.df, 1 - ALPHA / 2)) if self.df >= 1 else math.inf


def log_interval(ratio: Ratio | None) -> LogInterval | None:
    """The log-scale form of a ratio's 95% interval; None without one (no shared round, one round).

    Degrees of freedom: a side-by-side or time-to-train interval carries its own (``df``), paired
    fresh-process rounds have ``rounds - 1``."""
    if ratio is None or ratio.low is None or ratio.high is None:
        return None
    lo, hi = math.log1p(ratio.low), math.log1p(ratio.high)
    df = float(getattr(ratio, "df", 0.0) or ratio.rounds - 1)
    return LogInterval((lo + hi) / 2, (hi - lo) / 2, df) if df >= 1 else None


def p_value(ratio: Ratio | None) -> float | None:
    """Two-sided p-value of "no difference" from a ratio's interval (None without an interval)."""
    li = log_interval(ratio)
    if li is None:
        return None
    if li.half == 0:
        return 0.0 if li.mu != 0 else 1.0
    return float(2 * special.stdtr(li.df, -abs(li.mu) / li.se))


def classify(ratio: Ratio | None, margin: float) -> str:
    """A candidate against the leader (``ratio`` = candidate / leader): ``tied`` (the interval lies within
    +-``margin``), ``slower`` or ``faster`` (measurably, the interval beyond zero and not within the
    margin), or ``undetermined`` (the interval straddles the margin, or there is none: one round, no
    shared round)."""
    li = log_interval(ratio)
    if li is None:
        return "undetermined"
    m = math.log1p(margin)
    if -m < li.mu - li.half and li.mu + li.half < m:
        return "tied"
    if li.mu - li.half > 0:
        return "slower"
    if li.mu + li.half < 0:
        return "faster"
    return "undetermined"


def processes_to_decide(ratio: Ratio | None, margin: float, processes: int) -> int | None:
    """About how many further processes (rounds) would decide an undetermined comparison with 80% power if
    the difference is what it measured so far: the standard error shrinks as 1 / sqrt(n) with ``n``
    processes, and the comparison is decided once (t(df) + z(0.8)) standard errors fit in the distance of
    the estimate to the easier decision (tied: inside the margin; apart: beyond zero). A planning figure:
    the estimate itself is uncertain. A time to train's cold compiles (``floor_se``: one each, whatever the
    processes) do not shrink. None: no interval to scale, or more than :data:`MAX_MORE` (:func:`out_of_reach`
    tells the floor apart)."""
    li = log_interval(ratio)
    if li is None or processes < 1:
        return None
    m = math.log1p(margin)
    target = max(abs(li.mu), m - abs(li.mu))  # measurably apart, or tied
    if li.half <= target:
        return 0
    floor = min(float(getattr(ratio, "floor_se", 0.0) or 0.0), li.se)
    spread = math.sqrt(li.se**2 - floor**2) * math.sqrt(processes) * sd_bound(li.df)
    per_process = li.df / processes  # side by side, pooled windows add many df per process
    power = float(special.ndtri(POWER))
    for more in range(1, MAX_MORE + 1):
        n = processes + more
        t = float(special.stdtrit(li.df + per_process * more, 1 - ALPHA / 2))
        if (t + power) * math.sqrt(floor**2 + spread**2 / n) < target:
            return more
    return None


def out_of_reach(ratio: Ratio | None, margin: float) -> bool:
    """Whether no number of processes can decide this comparison at its estimate: the part of its interval that
    the cold compiles leave (``floor_se``) already covers the distance to either decision."""
    li = log_interval(ratio)
    floor = float(getattr(ratio, "floor_se", 0.0) or 0.0)
    if li is None or not floor:
        return False
    target = max(abs(li.mu), math.log1p(margin) - abs(li.mu))
    return (float(special.ndtri(1 - ALPHA / 2)) + float(special.ndtri(POWER))) * floor >= target


def sd_bound(df: float) -> float:
    """The factor on a sample sd of ``df`` degrees of freedom that plans with: its upper confidence bound at level
    ``0.5 + 0.3 / df``. At face value the sd of a few processes is below the truth more often than not, and plans
    made from 3 rounds (2 df) decided 60 % of the time against the 80 % named; with this bound they decide 79-93 %,
    from 5 rounds 80-98 %, from 7 rounds 84-100 % (``tests/test_decision_rules.py``, 0-3 % true differences at
    1-3 % noise, 1500 studies each). Over about 30 df it is 1 within 2 %."""
    if df < 1:
        return 1.0
    return math.sqrt(df / float(special.chdtri(df, 0.5 + 0.3 / df)))


def holm(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected at family-wise level ``alpha`` (None: not tested,
    never rejected, not counted in the family)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    for rank, (p, i) in enumerate(tested):
        if p > alpha / (len(tested) - rank):
            break
        rejected[i] = True
    return rejected


def first_look(processes: int) -> int | None:
    """After how many side-by-side processes the verdicts are read first (half of them, rounded up), or None
    (one look, at ``ALPHA``) with fewer than 5: 2 processes leave a process-means interval 1 degree of freedom."""
    return math.ceil(processes / 2) if processes >= 5 else None


def two_looks(first: Sequence[float | None], final: Sequence[float | None]) -> tuple[list[bool], list[bool]]:
    """Holm at two looks: which hypotheses stop at the first (rejected at ``LOOK_ALPHAS[0]`` over all of them,
    ``first`` their p-values then), and which are rejected at the end (``final``: the p-values with every
    process, Holm at ``LOOK_ALPHAS[1]`` over those still running). The chance of one or more false rejections
    is at most the sum: one at the end with none at the first needs the end's Holm to reject a true
    hypothesis among all the true ones, which it does with chance at most its level."""
    stopped = holm(first, LOOK_ALPHAS[0])
    later = holm([None if s else p for s, p in zip(stopped, final, strict=True)], LOOK_ALPHAS[1])
    return stopped, later


def expected_max_normal(k: int) -> float:
    """E[max of ``k`` standard normals] (Blom's approximation; 0 for k = 1): how many standard deviations
    the best of ``k`` equally good noisy measurements is lucky by."""
    if k <= 1:
        return 0.0
    return float(special.ndtri((k - 0.375) / (k + 0.25)))


def window_spread(runs: Sequence[tuple[float, int]]) -> float | None:
    """How far one timed window strays from its process's level on this machine now: the windows' relative sd
    (``step_s_cv``) pooled over alone processes, each weighted by its windows (``runs``: (cv, windows)); None
    without any. A machine whose speed moves by the second moves a challenger's first windows against the
    best's level as much, which the prior of alone processes (measured on quieter days) does not know."""
    runs = [(cv, n) for cv, n in runs if n > 1]
    if not runs:
        return None
    return math.sqrt(sum(n * cv**2 for cv, n in runs) / sum(n for _, n in runs))


def prune_margin(noise: float, window_cv: float, k: int, alpha: float = PRUNE_ALPHA) -> float:
    """Log margin by which a challenger's first-window time to train must exceed the best's before it is
    pruned: the one-sided ``1 - alpha`` quantile of the difference of two alone processes (the challenger's
    process and its one window's spread, ``window_cv``; the best's process) plus the best's luck as the
    minimum of ``k`` noisy values (``noise``: relative sd across alone processes)."""
    z = float(special.ndtri(1 - alpha))
    return z * math.sqrt(2 * noise**2 + window_cv**2) + expected_max_normal(k) * noise


@dataclass(frozen=True)
class Race:
    """The confirmation's decision among candidates (indices into the caller's lists)."""

    leader: int
    """The best mean score, or the incumbent :func:`race` kept."""
    winner: int
    """The simplest of the leader and the candidates tied with it."""
    status: list[str]
    """Per candidate against the leader: ``leader``, ``tied``, ``slower``, ``faster``, ``undetermined``."""

    @property
    def decided(self) -> bool:
        """Every candidate is tied with the leader or measurably slower than it."""
        return all(s in ("leader", "tied", "slower") for s in self.status)

    def labelled(self, label: str) -> list[int]:
        return [i for i, s in enumerate(self.status) if s == label]


def race(means: Sequence[float], simplicity: Sequence[tuple[int, ...]],
         versus_leader: Callable[[int, int], Ratio | None], margin: float, incumbent: int | None = None) -> Race:
    """The leader (lowest mean log score), each candidate's status against it (``versus_leader(i, leader)``
    is candidate ``i`` / leader), and the winner: the simplest of the leader and those tied with it within
    +-``margin``. An undetermined candidate is not recommended over the leader (it is worse on average
    and not known to be within the margin): the report says how many processes would decide it.

    ``incumbent``: a known winner being re-verified (``study.reuse``). It leads unless a candidate is measurably
    faster than it (the interval beyond zero: 2.5 % of the time between equal programs), so a lower mean that
    the noise allows never replaces a recommendation the team acts on."""
    if incumbent is not None:
        status = ["leader" if i == incumbent else classify(versus_leader(i, incumbent), margin)
                  for i in range(len(means))]
        if "faster" not in status:
            return _decide(incumbent, status, means, simplicity)
    leader = min(range(len(means)), key=lambda i: means[i])
    status = ["leader" if i == leader else classify(versus_leader(i, leader), margin) for i in range(len(means))]
    return _decide(leader, status, means, simplicity)


def _decide(leader: int, status: list[str], means: Sequence[float], simplicity: Sequence[tuple[int, ...]]) -> Race:
    pool = [i for i, s in enumerate(status) if s in ("leader", "tied")]
    return Race(leader, min(pool, key=lambda i: (simplicity[i], means[i])), status)
