"""Per-knob verdicts: what changing one knob did, with its uncertainty.

When the study ran its verdict phase (:mod:`autocompile.study.phases.racing`), verdicts come from there: the
winner's one-knob neighbours, repeated in fresh processes and interleaved with the winner, each with
a 95% interval over rounds. Otherwise the search's matched pairs give a fallback, labelled as
single-process measurements. Two trials form a matched pair for a knob when their active
configurations differ in that knob only, so the difference is the knob's and nothing else's. The
effect is the median relative change in step time over the pairs; its uncertainty combines the
study's run-to-run noise (each trial is one fresh process; see ``racing.study_noise``) with the
spread between pairs, as a 95% half-width (1.96 standard uncertainties; every "±" of the report is a
95% half-width). An effect within it is "no measurable effect". Until the study measures its run-to-run noise,
the noise its rules assume stands in (:class:`SearchNoise`); a process timed in one window (a re-verification's
brief run, ``measure.windows=1``) has no spread of its own: it adds how far one window strays on this machine,
and where the study does not know that, its pair gives no verdict and its speedup no interval. When every
matched pair compiled one and the same program (equal fingerprints), the verdict is "identical
program": measured, and certain. Without a matched pair there is no verdict: a comparison of group
medians mixes in every other knob that varied.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from optuna import Study

from autocompile.config.choices import Knobs, KnobValue
from autocompile.config.knobs import KNOBS
from autocompile.report.findings.entry import Entry
from autocompile.study.phases.racing import NOISE_PRIOR, alone_window_spread
from autocompile.study.records.record import Measurement
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE
from autocompile.study.statistics.effect import Effect
from autocompile.study.statistics.intervals import satterthwaite, t_quantile
from autocompile.study.statistics.noise import Noise

Z95 = 1.96
"""Standard uncertainties in a 95% half-width (normal: the pooled noise has many degrees of freedom)."""


@dataclass(frozen=True)
class SearchNoise:
    """What the search's ± assume of one fresh process alone."""

    rel_sd: float
    """Relative sd of a process's step time across fresh processes: the study's, a related answer's, or the
    prior its rules use (:data:`decisions.PRIOR_ALONE_NOISE`)."""
    source: str
    """Which of the three, in words (empty: the study's own, which the report's noise line states)."""
    window_spread: float | None
    """How far one window strays from its process's level (``racing.alone_window_spread``); None: unknown."""

    @classmethod
    def of(cls, study: Study, own: Noise | None) -> SearchNoise:
        """``own``: the study's alone noise (``racing.study_noise``), which the report has read already."""
        spread = alone_window_spread(study)
        if own is not None:
            return cls(own.rel_sd, "", spread)
        if kept := study.user_attrs.get(NOISE_PRIOR):
            return cls(float(kept["rel_sd"]), f"a related answer's, {float(kept['rel_sd']):.1%}", spread)
        return cls(PRIOR_ALONE_NOISE, f"the prior {PRIOR_ALONE_NOISE:.1%} (the largest the 2-core VM's studies "
                   "recorded)", spread)

    def level_var(self, m: Measurement) -> tuple[float, float] | None:
        """How far one process's step time (the median of its windows) strays from that process's own level, as a
        relative variance and its degrees of freedom: the median's sampling error, ``(pi/2) x CV^2 / (n - 1)`` over
        its ``n`` windows, on ``n - 1`` df (the CV is read from those windows); one window, how far a window strays
        on this machine, taken as known (None: unknown)."""
        if (n := m.windows or 0) < 2:
            return (self.window_spread**2, math.inf) if self.window_spread is not None else None
        return math.pi / 2 * (m.step_s_cv or 0.0) ** 2 / (n - 1), n - 1

    def pair_sd(self, a: Measurement, b: Measurement) -> float | None:
        """Relative sd of ``a``'s step time over ``b``'s, one fresh process each: each process's run-to-run noise
        (taken as known) and how far each process's median strays from its level (:meth:`level_var`), widened by
        Student's t on their Welch-Satterthwaite df against the normal's 1.96, so that 1.96 sd is a 95 % half-width.
        Not the windows' spread itself: a process's level is known to its CV over the root of its windows
        (``pytorch/examples``' regression, window CV 18 % over 165 windows: 1.8 % across 8 fresh processes,
        ``benchmarks/results/cpu-2core/search_pair``). None where a process of one window meets an unknown window
        spread: no interval."""
        levels = [level for m in (a, b) if (level := self.level_var(m)) is not None]
        if len(levels) < 2:
            return None
        parts = [2 * self.rel_sd**2, *(v for v, _ in levels)]
        dfs = [math.inf, *(d for _, d in levels)]
        df = satterthwaite(parts, dfs)
        widen = t_quantile(df) / Z95 if math.isfinite(df) else 1.0
        return math.sqrt(sum(parts)) * widen


class Speedup(TypedDict):
    """The best trial over one baseline in the search (:func:`speedup`)."""

    step_speedup: float
    noise: float | None
    """The 95% half-width of ``step_speedup``; None: no interval (a process timed in one window)."""
    time_to_train_speedup: float
    same_trial: NotRequired[bool]
    """The best is this baseline's own trial: the ratio is 1 by identity, with no interval to say."""


def speedup(best: Entry, base: Entry, noise: SearchNoise) -> Speedup:
    """Best over a baseline in the search (one fresh process each): steady-state speedup with the 95%
    half-width of its noise, and time-to-train speedup."""
    if best.number == base.number:
        return {"step_speedup": 1.0, "noise": 0.0, "time_to_train_speedup": 1.0, "same_trial": True}
    ratio = base.result.step_s / best.result.step_s
    sd = noise.pair_sd(best.result, base.result)
    return {"step_speedup": ratio, "noise": Z95 * ratio * sd if sd is not None else None,
            "time_to_train_speedup": base.time_to_train_s / best.time_to_train_s}


def speedup_half(s: Speedup) -> str:
    """How a speedup's 95 % interval reads: ``± 0.05``, or why there is none."""
    if s.get("same_trial"):
        return "(the same trial: the best is this baseline)"
    return f"± {s['noise']:.2f}" if s["noise"] is not None else "(no interval: a process of one window)"


class CompiledProgram(TypedDict):
    """A configuration that compiled, and the fingerprint of what it compiled (``summary.compiled_programs``)."""

    config: Knobs
    fingerprint: str


def knob_effects(measured: list[Entry], programs: list[CompiledProgram] | None = None,
                 noise: SearchNoise | None = None) -> list[Effect]:
    """``measured``: one entry per complete trial (its active knobs and measurement);
    ``programs``: ``config`` and ``fingerprint`` of every configuration that compiled (those stopped as
    the same program as another included); ``noise``: what one fresh process's step time is worth (None: the
    rules' prior, the window spread unknown)."""
    noise = noise or SearchNoise(PRIOR_ALONE_NOISE, "the rules' prior", None)
    effects = []
    programs = programs or []
    for key, (spec, default) in KNOBS.items():
        values = {c[key] for c in [*(m.config for m in measured), *(p["config"] for p in programs)] if key in c}
        if len(values) < 2:
            continue
        reference = default if default in values else sorted(values, key=repr)[0]
        for value in sorted(values - {reference}, key=repr):
            same = identical_program(programs, key, reference, value)
            if same:
                effects.append(Effect(key, spec.question, reference, value, 0.0, 0.0, 0.0, same, True, True))
            elif (effect := matched_effect(measured, key, reference, value, noise)) is not None:
                effects.append(Effect(key, spec.question, reference, value, *effect))
    return effects


def identical_program(programs: list[CompiledProgram], key: str, reference: KnobValue, value: KnobValue) -> int:
    """Matched pairs (differing in ``key`` only) that compiled one program; 0 unless every pair did."""
    refs = {_rest(p["config"], key): p["fingerprint"] for p in programs if p["config"].get(key) == reference}
    pairs = [(p["fingerprint"], refs[_rest(p["config"], key)]) for p in programs
             if p["config"].get(key) == value and _rest(p["config"], key) in refs]
    return len(pairs) if pairs and all(a == b for a, b in pairs) else 0


def _rest(config: Knobs, key: str) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != key))


def matched_effect(measured: list[Entry], key: str, reference: KnobValue, value: KnobValue,
                   noise: SearchNoise) -> tuple | None:
    refs = {_rest(m.config, key): m.result for m in measured if m.config.get(key) == reference}
    ratios, noises, compile_deltas = [], [], []
    for m in measured:
        if m.config.get(key) != value:
            continue
        ref = refs.get(_rest(m.config, key))
        if ref is None:
            continue
        if (sd := noise.pair_sd(m.result, ref)) is None:
            continue  # a process of one window, and no window spread known: no interval
        ratios.append(m.result.step_s / ref.step_s - 1)
        noises.append(sd)
        compile_deltas.append(m.result.compile_s - ref.compile_s)
    if not ratios:
        return None
    spread = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    noise = statistics.median(noises) / math.sqrt(len(noises))
    return (statistics.median(ratios), Z95 * max(noise, spread), statistics.median(compile_deltas), len(ratios),
            True)
