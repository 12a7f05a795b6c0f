"""``task=compare``'s answer, typed: each candidate's cold run and step time, and each against the first.

``Comparison.as_dict`` is ``compare.json`` (the shape every record under ``benchmarks/`` has); the terminal
table (:mod:`autocompile.report.compare_table`) and the command's exit status read the fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autocompile.config.choices import Knobs, Method
from autocompile.study.statistics.intervals import Paired


@dataclass(frozen=True)
class CompareRow:
    """One candidate: its cold run alone and its step time where it was timed."""

    label: str
    """``<index>: <the candidate as given>``."""
    knobs: Knobs
    name: str
    status: str | None
    """Its cold run's status (``ok``, ``failed``)."""
    reason: str | None
    step_s: float | None
    """Its step time side by side (median over processes of its windows) or over its fresh-process rounds."""
    step_s_alone: float | None
    """Its cold run's step time, alone in its process."""
    compile_s: float | None
    """Cold compile seconds (its cold run)."""
    peak_memory_bytes: int | None
    fingerprint: str | None
    throughput_unit: str
    cold_trial: str | None
    """Its cold run's directory (candidates that are the same configuration share one)."""


@dataclass(frozen=True)
class ComparePair:
    """Candidate ``b`` against the first (``a``): step time, time to train, and a verdict in words."""

    a: int
    b: int
    step: Paired
    time_to_train: Paired
    horizon_steps: int
    break_even: str | None
    """When a slower-compiling candidate pays its compile back (None: it does not apply)."""
    alone_agrees: bool
    """The cold runs' ratio alone agrees with the side-by-side one (False: neither is the answer)."""
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "change": self.step.change, "low": self.step.low, "high": self.step.high,
                "measurable": self.step.measurable, "step": self.step.as_dict(),
                "time_to_train": self.time_to_train.as_dict(), "horizon_steps": self.horizon_steps,
                "break_even": self.break_even, "alone_agrees": self.alone_agrees, "verdict": self.verdict}


@dataclass(frozen=True)
class Failed:
    label: str
    reason: str | None


@dataclass
class Comparison:
    """Every candidate and every pair, with how they were timed."""

    method: Method | str
    """``side_by_side``, ``fresh_processes``, or ``none`` (fewer than two candidates ran)."""
    why: str
    """Why not side by side (empty when it was)."""
    processes: int
    model: str
    """The statistical model behind the intervals, in words."""
    candidates: list[CompareRow]
    pairs: list[ComparePair]
    alone_cv: float
    """The cold runs' noise the alone check used (a prior, or the processes' own spread)."""
    wall_s: dict[str, float]
    speed_changes: list[str] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    run_dir: str = ""

    @property
    def complete(self) -> bool:
        """Every candidate was compared with the first."""
        return len(self.pairs) + 1 >= len(self.candidates)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "why": self.why, "processes": self.processes, "model": self.model,
                "candidates": [asdict(c) for c in self.candidates], "pairs": [p.as_dict() for p in self.pairs],
                "alone_cv": self.alone_cv, "wall_s": self.wall_s, "speed_changes": self.speed_changes,
                "failed": [asdict(f) for f in self.failed], "run_dir": self.run_dir}
