"""Per-knob verdicts: what changing one knob did, with its uncertainty.

When the study ran its verdict phase (:mod:`autocompile.study.phases.racing`), verdicts come from there: the
winner's one-knob neighbours, repeated in fresh processes and interleaved with the winner, each with
a 95% interval over rounds. Otherwise the search's matched pairs give a fallback, labelled as
single-process measurements. Two trials form a matched pair for a knob when their active
configurations differ in that knob only, so the difference is the knob's and nothing else's. The
effect is the median relative change in step time over the pairs; its uncertainty combines the
study's run-to-run noise (each trial is one fresh process; see ``racing.study_noise``) with the
spread between pairs, as a 95% half-width (1.96 standard uncertainties; every "±" of the report is a
95% half-width). An effect within it is "no measurable effect". When every
matched pair compiled one and the same program (equal fingerprints), the verdict is "identical
program": measured, and certain. Without a matched pair there is no verdict: a comparison of group
medians mixes in every other knob that varied.
"""

from __future__ import annotations

import math
import statistics
from typing import TypedDict

from autocompile.config.choices import Knobs, KnobValue
from autocompile.config.knobs import KNOBS
from autocompile.report.findings.entry import Entry
from autocompile.study.statistics.effect import Effect

Z95 = 1.96
"""Standard uncertainties in a 95% half-width (normal: the pooled noise has many degrees of freedom)."""


class CompiledProgram(TypedDict):
    """A configuration that compiled, and the fingerprint of what it compiled (``summary.compiled_programs``)."""

    config: Knobs
    fingerprint: str


def knob_effects(measured: list[Entry], programs: list[CompiledProgram] | None = None,
                 noise: float = 0.0) -> list[Effect]:
    """``measured``: one entry per complete trial (its active knobs and measurement);
    ``programs``: ``config`` and ``fingerprint`` of every configuration that compiled (those stopped as
    the same program as another included); ``noise``: the study's run-to-run relative sd of step time
    (0 = unknown: the windows' noise inside each process stands in, and understates it)."""
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
                   noise: float = 0.0) -> tuple | None:
    refs = {_rest(m.config, key): m.result for m in measured if m.config.get(key) == reference}
    ratios, noises, compile_deltas = [], [], []
    for m in measured:
        if m.config.get(key) != value:
            continue
        ref = refs.get(_rest(m.config, key))
        if ref is None:
            continue
        ratios.append(m.result.step_s / ref.step_s - 1)
        within = math.hypot(m.result.step_s_cv or 0, ref.step_s_cv or 0)
        noises.append(max(within, math.sqrt(2) * noise))  # two fresh processes, each with run-to-run noise
        compile_deltas.append(m.result.compile_s - ref.compile_s)
    if not ratios:
        return None
    spread = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else 0.0
    noise = statistics.median(noises) / math.sqrt(len(noises))
    return (statistics.median(ratios), Z95 * max(noise, spread), statistics.median(compile_deltas), len(ratios),
            True)
