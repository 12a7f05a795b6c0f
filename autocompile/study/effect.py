"""A per-knob verdict: what changing one knob did, with its uncertainty (computed by
:mod:`autocompile.study.racing` from the verdict phase, by :mod:`autocompile.report.effects` from the
search's matched pairs; read by the report, the exports and MLflow)."""

from __future__ import annotations

from dataclasses import dataclass
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
    """Single-process basis: the effect's standard uncertainty (relative)."""
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
