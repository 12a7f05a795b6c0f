"""Per-knob verdicts: what changing one knob did, with its uncertainty.

When the study ran its verdict phase (:mod:`autocompile.study.racing`), verdicts come from there: the
winner's one-knob neighbours, repeated in fresh processes and interleaved with the winner, each with
a 95% interval over rounds. Otherwise the search's matched pairs give a fallback, labelled as
single-process measurements. Two trials form a matched pair for a knob when their active
configurations differ in that knob only, so the difference is the knob's and nothing else's. The
effect is the median relative change in step time over the pairs; its uncertainty combines the
study's run-to-run noise (each trial is one fresh process; see ``racing.study_noise``) with the
spread between pairs. An effect within twice its uncertainty is "no measurable effect". When every
matched pair compiled one and the same program (equal fingerprints), the verdict is "identical
program": measured, and certain. Without a matched pair there is no verdict: a comparison of group
medians mixes in every other knob that varied.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from autocompile.config.knobs import KNOBS
from autocompile.report.entry import Entry


@dataclass
class Effect:
    knob: str
    question: str
    reference: Any
    value: Any
    step_change: float
    """Relative change of step time, value vs reference (negative = faster)."""
    uncertainty: float
    compile_change_s: float
    """Change of compile seconds, value vs reference."""
    pairs: int
    matched: bool
    identical: bool = False
    """Every matched pair compiled the same program: the knob cannot matter on this workload."""
    basis: str = "single-process"
    """``verdict``: the verdict phase (repeats interleaved with the winner); ``single-process``: the
    search's matched pairs, one fresh process per configuration."""
    low: float | None = None
    """Verdict phase: 95% interval of ``step_change`` over rounds."""
    high: float | None = None
    failure: str = ""
    """Verdict phase: the neighbour failed (e.g. a graph break under fullgraph) and why."""
    how: str = "interleaved rounds"
    """Verdict phase: how the steps were compared (``paired windows side by side in N processes``)."""
    pays_back: str = ""
    """Faster steps but a longer compile: after how many steps it pays back."""

    @property
    def measurable(self) -> bool:
        if self.identical or self.failure:
            return False
        if self.basis == "verdict":
            return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)
        return abs(self.step_change) > 2 * self.uncertainty

    @property
    def verdict(self) -> str:
        if self.basis == "verdict":
            return self._verdict_phase()
        if self.identical:
            return (f"{self.value} vs {self.reference}: identical program (the same compiled graphs in "
                    f"{self.pairs} matched pair{'s' * (self.pairs != 1)}): cannot matter here")
        compile_part = f"compile {self.compile_change_s:+.1f} s"
        if not self.measurable:
            step_part = f"no measurable effect on step time ({self.step_change:+.1%} ± {self.uncertainty:.1%})"
        else:
            word = "faster" if self.step_change < 0 else "slower"
            step_part = f"steps {abs(self.step_change):.1%} {word} (± {self.uncertainty:.1%})"
        basis = f"{self.pairs} matched pair{'s' * (self.pairs != 1)}" if self.matched else (
            "group medians, confounded: no matched pair")
        return f"{self.value} vs {self.reference}: {step_part}, {compile_part}; {basis}, single-process measurements"

    def _verdict_phase(self) -> str:
        head = f"at the best configuration, {self.value} instead of {self.reference}"
        if self.identical:
            return f"{head}: identical program (compiles the same graphs): cannot matter here"
        if self.failure:
            return f"{head}: fails ({self.failure})"
        if self.low is None or self.high is None:
            interval = f"{self.step_change:+.1%} (one round: no interval)"
        else:
            interval = f"{self.step_change:+.1%} [95% CI {self.low * 100:+.1f}, {self.high * 100:+.1f}]"
        if self.measurable:
            word = "slower" if self.step_change > 0 else "faster"
            judged = f"measurably {word}"
        else:
            judged = "no measurable effect"
        pays = f"; {self.pays_back}" if self.pays_back else ""
        return (f"{head}: step time {interval}, {judged}; compile {self.compile_change_s:+.1f} s (cold, one run "
                f"each){pays}; {self.pairs} {self.how}")

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "question": self.question, "reference": self.reference, "value": self.value,
                "step_change": self.step_change, "uncertainty": self.uncertainty,
                "compile_change_s": self.compile_change_s, "pairs": self.pairs, "matched": self.matched,
                "measurable": self.measurable, "identical": self.identical, "basis": self.basis, "low": self.low,
                "high": self.high, "failure": self.failure, "how": self.how, "pays_back": self.pays_back,
                "verdict": self.verdict}


def knob_effects(measured: list[Entry], programs: list[dict[str, Any]] | None = None,
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


def identical_program(programs: list[dict[str, Any]], key: str, reference: Any, value: Any) -> int:
    """Matched pairs (differing in ``key`` only) that compiled one program; 0 unless every pair did."""
    refs = {_rest(p["config"], key): p["fingerprint"] for p in programs if p["config"].get(key) == reference}
    pairs = [(p["fingerprint"], refs[_rest(p["config"], key)]) for p in programs
             if p["config"].get(key) == value and _rest(p["config"], key) in refs]
    return len(pairs) if pairs and all(a == b for a, b in pairs) else 0


def _rest(config: dict[str, Any], key: str) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != key))


def matched_effect(measured: list[Entry], key: str, reference: Any, value: Any,
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
    return (statistics.median(ratios), max(noise, spread), statistics.median(compile_deltas), len(ratios), True)
