"""Intervals for candidates timed side by side: windows paired within rounds, rounds within processes.

The model, per pair of candidates ``a`` and ``b``: the log-ratio of their window step times in round
``r`` of process ``p`` is ``d[p, r] = mu + u[p] + e[p, r]``, with ``e`` the window-to-window noise
(independent, sd ``sigma_w``) and ``u`` a random effect per process (sd ``sigma_p``: whatever makes
one process favour a candidate more than another does, such as where its memory landed). The
estimate of ``mu`` is the mean of the process means, so every process weighs alike.

Its interval is the wider of two, so it is never narrower than what the processes show:

- the windows pooled across processes: Var = sigma_w^2 mean(1/R_p) / P with sum(R_p - 1) degrees of
  freedom (right when processes agree);
- the process means as the data: Var = var(means) / P with P - 1 degrees of freedom, which widens as
  the processes disagree (and carries the process effect whatever its size).

An F test of the process effect is reported beside it (``process_p``; None where it cannot be made: one
process, or one round per process, whose process means are then the data).

With one process the process effect cannot be seen: the interval is the windows' alone and says so.
``exp`` of the interval is the ratio ``b / a`` a user reads ("+3.1 %").

Fresh-process rounds are paired by round (:func:`paired_ratio`). Why log-ratios: step times are positive and
their noise is multiplicative (a busy neighbour slows every step by some factor), so ``log(a / b)`` is close to
symmetric and its mean over rounds, exponentiated, is a ratio a user reads. Pairing by round cancels what a
round shares: candidates measured back to back in one round saw the same machine state.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from scipy import special

from autocompile.trial.timing.stats import clean_rounds, t975


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
class Paired(Ratio):
    """A side-by-side ratio: ``rounds`` paired windows over ``processes`` processes."""

    processes: int = 1
    basis: str = ""
    """How the interval was made: ``windows pooled``, ``process means`` or ``one process``."""
    process_p: float | None = None
    """p-value of the F test for a process effect (None with one process)."""
    log_se: float = 0.0
    """Standard error of the mean log-ratio, and its degrees of freedom (for combining with compile time)."""
    df: float = 0.0
    dropped: int = 0
    """Rounds left out because a window of either side stalled (``trial.timing.stats.STALL``)."""
    floor_se: float = 0.0
    """The part of ``log_se`` no further process shrinks: a time to train's cold compiles (one each)."""

    def as_dict(self) -> dict[str, float | int | bool | str | None]:
        return {**super().as_dict(), "processes": self.processes, "basis": self.basis, "process_p": self.process_p,
                "log_se": self.log_se, "df": self.df, "dropped": self.dropped, "floor_se": self.floor_se}


def paired_windows(a: Mapping[int, Sequence[float]], b: Mapping[int, Sequence[float]],
                   cpu_a: Mapping[int, Sequence[float]] | None = None,
                   cpu_b: Mapping[int, Sequence[float]] | None = None) -> Paired | None:
    """``b / a`` from window step times per process (process -> windows, aligned by round); None when no
    process timed both. ``cpu_a`` / ``cpu_b``: the windows' process CPU seconds, which tell a descheduled
    window from the program's own slow one (``trial.timing.stats.descheduled``); without them a window over
    ``STALL`` x the median is taken for a stall."""
    groups = []
    dropped = 0
    for p in sorted(a.keys() & b.keys()):
        cpu = [(cpu_a or {}).get(p), (cpu_b or {}).get(p)]
        rounds = clean_rounds(a[p], b[p], cpu=cpu)  # a stalled window says nothing about either program
        dropped += min(len(a[p]), len(b[p])) - len(rounds)
        logs = [math.log(b[p][r] / a[p][r]) for r in rounds if a[p][r] > 0 and b[p][r] > 0]
        if logs:
            groups.append(logs)
    if not groups:
        return None
    means = [statistics.fmean(g) for g in groups]
    mu = statistics.fmean(means)
    rounds = sum(map(len, groups))
    df_w = sum(len(g) - 1 for g in groups)
    ms_w = sum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g) / df_w if df_w else math.nan
    inv_r = statistics.fmean(1 / len(g) for g in groups)
    if len(groups) == 1:
        var, df, basis, p_value = ms_w * inv_r, df_w, "one process", None
    elif not df_w:  # one round per process: the process means are the data, no window-level test
        var, df, basis, p_value = statistics.variance(means) / len(groups), len(groups) - 1, "process means", None
    else:
        s2_means = statistics.variance(means)
        f = s2_means / (ms_w * inv_r) if ms_w > 0 else math.inf
        p_value = float(special.fdtrc(len(groups) - 1, df_w, f))
        pooled = (ms_w * inv_r / len(groups), df_w, "windows pooled")
        means_only = (s2_means / len(groups), len(groups) - 1, "process means")
        var, df, basis = max(pooled, means_only, key=_half_width)
    return replace(_interval(mu, var, df, rounds, len(groups), basis, p_value), dropped=dropped)


def _half_width(estimate: tuple[float, float, str]) -> float:
    var, df, _ = estimate
    return t_quantile(df) * math.sqrt(var) if df >= 1 else math.inf


def t_quantile(df: float, confidence: float = 0.95) -> float:
    """The quantile of Student's t of a two-sided interval at ``confidence`` (97.5 % for 95 %)."""
    return float(special.stdtrit(df, 0.5 + confidence / 2))


def satterthwaite(parts: Sequence[float], dfs: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates ``parts``, each with its ``dfs``
    (``math.inf`` for a variance taken as known, such as a prior)."""
    var = sum(parts)
    tails = sum(v**2 / d for v, d in zip(parts, dfs, strict=True) if v > 0)
    return var**2 / tails if tails > 0 else math.inf


def at_level(ratio: Paired, confidence: float) -> Paired:
    """The same estimate with its interval at another two-sided ``confidence`` (a verdict read at one of two
    looks, :func:`autocompile.study.statistics.decisions.two_looks`: 99 % or 96 %)."""
    if ratio.df < 1 or ratio.low is None:
        return ratio
    mu, half = math.log1p(ratio.change), t_quantile(ratio.df, confidence) * ratio.log_se
    return replace(ratio, low=math.expm1(mu - half), high=math.expm1(mu + half))


def _interval(mu: float, var: float, df: float, rounds: int, processes: int, basis: str,
              p_value: float | None) -> Paired:
    se = math.sqrt(var) if var == var and var >= 0 else math.nan
    if df < 1 or se != se:
        return Paired(math.expm1(mu), None, None, rounds, processes, basis, p_value, 0.0, 0.0)
    half = t_quantile(df) * se
    return Paired(math.expm1(mu), math.expm1(mu - half), math.expm1(mu + half), rounds, processes, basis, p_value,
                  se, df)


@dataclass(frozen=True)
class CompileSpread:
    """The relative sd of one cold compile across fresh processes, with its degrees of freedom and source."""

    cv: float
    df: float
    source: str
    """What it rests on: the prior, and what the study measured (programs compiled cold more than once)."""
    measured_cv: float | None = None
    """The study's own part (None: no program compiled cold twice), which later studies on this device learn
    their prior from (:mod:`autocompile.study.records.compile_prior`)."""
    measured_df: float = 0.0
    device: str = ""
    """The device it was measured on (``Settings.device_name``)."""

    def as_dict(self) -> dict[str, float | str | None]:
        return {"cv": self.cv, "df": self.df, "source": self.source, "measured_cv": self.measured_cv,
                "measured_df": self.measured_df, "device": self.device}


def pooled_spread(prior: CompileSpread, measured_cv: float | None, measured_df: float, programs: int = 0
                  ) -> CompileSpread:
    """The prior and the study's measurement together, each weighted by its degrees of freedom (a pooled variance:
    the prior counts as ``prior.df`` cold compiles' worth). A study's 1-3 df alone leave intervals of +-40 %
    (median; coverage 92 % at 1 df), the prior alone cannot learn a wider spread; pooled, both hold
    (``tests/test_interval_simulations.py``, ``benchmarks/results/cpu-2core/compile_spread_rules.md``)."""
    if measured_cv is None or measured_df < 1:
        return replace(prior, source=f"{prior.source}; no program was compiled cold twice in this study")
    df = prior.df + measured_df
    cv = math.sqrt((prior.df * prior.cv**2 + measured_df * measured_cv**2) / df)
    return CompileSpread(cv, df, f"{prior.source}, pooled with the study's {measured_cv:.1%} on {measured_df:g} df "
                                 f"({programs} program(s) compiled cold more than once): {cv:.1%} on {df:g} df",
                         measured_cv, measured_df, prior.device)


def from_rounds(ratio: Ratio | None) -> Paired | None:
    """A fresh-process rounds ratio (:func:`paired_ratio`) as a :class:`Paired` with its log-scale
    standard error and ``rounds - 1`` degrees of freedom (each round a process per candidate)."""
    if ratio is None:
        return None
    df = ratio.rounds - 1
    se = (math.log1p(ratio.high) - math.log1p(ratio.change)) / t975(df) if ratio.high is not None else 0.0
    return Paired(ratio.change, ratio.low, ratio.high, ratio.rounds, ratio.rounds, "fresh-process rounds", None,
                  se, df)


def level(per_process: Mapping[int, Sequence[float]]) -> tuple[float, float]:
    """Standard error of a candidate's mean log step time over processes (each process's mean log window, or
    one fresh process's step time), with its degrees of freedom; (0, 0) from one process. A time-to-train
    ratio depends on the absolute step time (against the compile), which processes disagree on."""
    means = [statistics.fmean(math.log(x) for x in w) for w in per_process.values() if w and min(w) > 0]
    if len(means) < 2:
        return 0.0, 0.0
    return statistics.stdev(means) / math.sqrt(len(means)), len(means) - 1


def time_to_train(step: Paired, a: tuple[float, float], b: tuple[float, float], horizon: int,
                  compile_cv: float, compile_df: float = 4, shared_cold: bool = False,
                  step_level: tuple[float, float] = (0.0, 0.0)) -> Paired:
    """``b / a`` of time to train ``horizon`` steps (cold compile + steps), from the paired step ratio and
    each side's cold compile seconds; ``a`` and ``b`` are (step seconds, compile seconds).

    Delta method on the log scale: the step ratio's variance weighted by the steps' share of the time,
    plus each compile's (``compile_cv``: relative sd of one cold compile across fresh processes, with
    ``compile_df`` degrees of freedom) weighted by the compile's share; degrees of freedom by
    Welch-Satterthwaite. ``shared_cold``: both sides took their compile time from one cold run (an A/A
    comparison), whose error enters both times alike: only the difference of the shares carries it.
    ``step_level``: (standard error, df) of the log of the absolute step time (:func:`level`), which moves
    both step times together and so the ratio by the difference of the steps' shares. The basis says which
    compile spread the interval used, on how many df."""
    (sa, ca), (sb, cb) = a, b
    ta, tb = ca + horizon * sa, cb + horizon * sb
    mu = math.log(tb / ta)
    w_step = (horizon * sa / ta + horizon * sb / tb) / 2
    # Both compiles' variances come from one estimate of the spread: one part with its df, not two.
    compiles = (ca / ta - cb / tb) ** 2 if shared_cold else (ca / ta) ** 2 + (cb / tb) ** 2
    parts = [(w_step * step.log_se) ** 2, compiles * compile_cv**2]
    dfs = [step.df, compile_df]
    if step_level[1] >= 1:
        parts.append(((horizon * sb / tb - horizon * sa / ta) * step_level[0]) ** 2)
        dfs.append(step_level[1])
    var = sum(parts)
    if not step.df:
        return Paired(math.expm1(mu), None, None, step.rounds, step.processes, step.basis, step.process_p)
    df = satterthwaite(parts, dfs) if var > 0 else step.df
    found = _interval(mu, var, df, step.rounds, step.processes, step.basis + f" + cold compile spread "
                      f"{compile_cv:.1%} on {compile_df:g} df", step.process_p)
    return replace(found, floor_se=math.sqrt(parts[1]))


MIN_EXTRA_COMPILE_S = 0.5
"""A compile this much longer or less is no cost to pay back (eager runs differ by tenths of a second)."""


def break_even(step: Paired, a: tuple[float, float], b: tuple[float, float],
               names: tuple[str, str] = ("a", "b")) -> str | None:
    """When one side has measurably faster steps but the longer compile: after how many steps it pays
    back, with the range the step interval allows. ``step`` is ``b / a``; ``a`` and ``b`` are (step
    seconds, compile seconds)."""
    (sa, ca), (sb, cb) = a, b
    if step.high is None or step.low is None or not step.measurable or abs(cb - ca) < MIN_EXTRA_COMPILE_S:
        return None
    if step.high < 0 and cb > ca:  # b steps faster, compiles longer
        fast, slow_step, extra, gain = names[1], sa, cb - ca, (-step.low, -step.change, -step.high)
    elif step.low > 0 and ca > cb:  # a steps faster (b / a - 1 > 0), compiles longer
        fast, slow_step, extra = names[0], sb, ca - cb
        gain = tuple(1 - 1 / (1 + x) for x in (step.high, step.change, step.low))
    else:
        return None
    most, mid, least = (extra / (slow_step * g) for g in gain)
    return (f"{fast}: steps {gain[1]:.1%} faster, compile +{extra:.0f} s: at {slow_step * 1e3:.1f} ms a step it "
            f"pays back after about {mid:,.0f} steps ({most:,.0f}-{least:,.0f})")
