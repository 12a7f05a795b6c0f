"""A per-knob verdict: what changing one knob did, with its uncertainty (computed by
:mod:`autocompile.study.phases.racing` from the verdict phase, by
:mod:`autocompile.report.findings.search_effects` from the search's matched
pairs; read by the report, the exports and MLflow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Effect:
    """What changing one knob did, with its uncertainty: a verdict of the verdict phase or of the search's
    matched pairs."""

    knob: str
    """The knob changed (``compile.scope``)."""
    question: str
    """The user question it answers (the knob's ``question``)."""
    reference: Any
    """The knob's value in the configuration compared against (the winner's)."""
    value: Any
    """The value it was changed to."""
    step_change: float
    """Relative change of step time, value vs reference (negative = faster)."""
    uncertainty: float
    """The 95% half-width of ``step_change`` (relative): single-process basis, 1.96 x its standard
    uncertainty; verdict phase, half the interval's width. Every "±" of the report is such a half-width."""
    compile_change_s: float
    """Change of compile seconds, value vs reference."""
    pairs: int
    """Matched pairs, or rounds / processes of the verdict phase, behind it."""
    matched: bool
    """Measured on configurations that differ in this knob only."""
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
    p_value: float | None = None
    """Verdict phase: two-sided p-value of "no effect on step time"."""
    family: int = 0
    """Verdict phase: how many verdicts were tested together (Holm's family)."""
    family_measurable: bool | None = None
    """Verdict phase: Holm's decision at family-wise 5% over the study's verdicts (None: not corrected)."""
    trial: int | None = None
    """Verdict phase: the neighbour's first (cold) run, which records its configuration and compile."""
    score_change: float | None = None
    """Verdict phase: relative change of time to train (cold compile + horizon), value vs reference, with its
    95% interval (the study's compile spread carried in)."""
    score_low: float | None = None
    score_high: float | None = None
    score_p_value: float | None = None
    score_spread: str = ""
    """Verdict phase: the cold-compile spread its time-to-train interval carries and on how many df."""
    beats_winner: bool = False
    """Measurably faster to train than the winner, after Holm's correction over the neighbours."""
    also: dict[str, Any] = field(default_factory=dict)
    """Verdict phase: other knobs the neighbour had to change to be valid (train_step with fused AdamW: the
    optimizer's implementation too), knob -> its value."""
    speed_changes: list[str] = field(default_factory=list)
    """Verdict phase: the winner or the neighbour changed speed within a process (one line each,
    ``statistics.noise.ChangePoint.text``): a process mean that blends two speeds."""

    score_measurable: bool | None = None
    """Verdict phase: the time-to-train difference is measurable after Holm's correction (None: not tested)."""
    level: float = 0.95
    """Verdict phase: the confidence of ``low``/``high`` and the time-to-train interval: 95 %, or where the phase
    was read at two looks (``statistics/decisions.py: two_looks``) 99 % at the first, 96 % at the end."""
    look: int = 0
    """Verdict phase read at two looks: the look that decided it (1: it left after half the processes; 2: the
    end); 0: one look."""

    score_floor: float | None = None
    """Verdict phase: the log-scale sd of the time-to-train ratio from the two cold compiles alone, the part of
    its interval that more side-by-side processes cannot narrow."""
    not_asked: str = ""
    """Verdict phase: why ``study.verdicts=auto`` did not ask this question at the winner (it cannot change the
    recommendation there); nothing was measured for it."""

    memory_change: float | None = None
    """Verdict phase: relative change of peak memory, the neighbour's cold run alone against the winner's (one run
    each): what checkpointing or a memory budget buys, weighed beside its step time."""

    @property
    def measurable(self) -> bool:
        if self.identical or self.failure or self.not_asked:
            return False
        if self.basis == "verdict":
            apart = self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)
            return apart if self.family_measurable is None else self.family_measurable
        return abs(self.step_change) > self.uncertainty

    @property
    def verdict(self) -> str:
        if self.basis == "verdict":
            return self._verdict_phase()
        if self.identical:
            return (f"{self.value} vs {self.reference}: identical program (the same compiled graphs in "
                    f"{self.pairs} matched pair{'s' * (self.pairs != 1)}): cannot matter here")
        compile_part = f"compile {self.compile_change_s:+.1f} s"
        if not self.measurable:
            step_part = f"no measurable effect on step time ({self.step_change:+.1%} ± {self.uncertainty:.1%}, 95%)"
        else:
            word = "faster" if self.step_change < 0 else "slower"
            step_part = f"steps {abs(self.step_change):.1%} {word} (± {self.uncertainty:.1%}, 95%)"
        basis = f"{self.pairs} matched pair{'s' * (self.pairs != 1)}" if self.matched else (
            "group medians, confounded: no matched pair")
        return f"{self.value} vs {self.reference}: {step_part}, {compile_part}; {basis}, single-process measurements"

    def _verdict_phase(self) -> str:
        if self.not_asked:
            return f"not asked at the best configuration ({self.knob}={self.reference}): {self.not_asked}"
        head = f"at the best configuration, {self.value} instead of {self.reference}"
        if self.also:
            changed = ", ".join(f"{k}={v}" for k, v in self.also.items())
            head += f" (with {changed}: the nearest valid configuration)"
        if self.identical:
            return f"{head}: identical program (compiles the same graphs): cannot matter here"
        if self.failure:
            return f"{head}: fails ({self.failure})"
        if self.low is None or self.high is None:
            interval = f"{self.step_change:+.1%} (one round: no interval)"
        else:
            interval = f"{self.step_change:+.1%} [{self.level:.0%} CI {self.low * 100:+.1f}, {self.high * 100:+.1f}]"
        if self.measurable:
            word = "slower" if self.step_change > 0 else "faster"
            judged = f"measurably {word}"
        else:
            judged = "no measurable effect"
        if self.family > 1:
            judged += f" (Holm over {self.family} verdicts, p = {self.p_value:.2g})"
        pays = f"; {self.pays_back}" if self.pays_back else ""
        ttt = ""
        if self.score_change is not None and self.score_low is not None and self.score_high is not None:
            ttt = (f"; time to train {self.score_change:+.1%} [{self.level:.0%} CI {self.score_low * 100:+.1f}, "
                   f"{self.score_high * 100:+.1f}]" + (f" ({self.score_spread})" if self.score_spread else "")
                   + (", measurably faster than the winner" if self.beats_winner else ""))
        changes = "".join(f"; {line}" for line in self.speed_changes)
        if self.look == 1 and self.score_measurable is False:
            changes += ("; decided in step time after the first half of the processes (read at 1 %), it left the "
                        "rest: its time to train lies within what its and the winner's cold compiles leave open, "
                        "which more processes cannot narrow (more cold compiles would)")
        elif self.look == 1:
            changes += "; decided after the first half of the processes (read at 1 %), it left the rest"
        memory = f", peak memory {self.memory_change:+.0%}" if self.memory_change is not None else ""
        return (f"{head}: step time {interval}, {judged}; compile {self.compile_change_s:+.1f} s{memory} (cold, one "
                f"run each){pays}{ttt}; {self.pairs} {self.how}{changes}")

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "question": self.question, "reference": self.reference, "value": self.value,
                "step_change": self.step_change, "uncertainty": self.uncertainty,
                "compile_change_s": self.compile_change_s, "pairs": self.pairs, "matched": self.matched,
                "measurable": self.measurable, "identical": self.identical, "basis": self.basis, "low": self.low,
                "high": self.high, "failure": self.failure, "how": self.how, "pays_back": self.pays_back,
                "p_value": self.p_value, "family": self.family, "family_measurable": self.family_measurable,
                "trial": self.trial, "score_change": self.score_change, "score_low": self.score_low,
                "score_high": self.score_high, "score_p_value": self.score_p_value, "score_spread": self.score_spread,
                "beats_winner": self.beats_winner,
                "also": self.also, "speed_changes": self.speed_changes, "memory_change": self.memory_change,
                "score_measurable": self.score_measurable, "level": self.level, "look": self.look,
                "not_asked": self.not_asked, "verdict": self.verdict}
