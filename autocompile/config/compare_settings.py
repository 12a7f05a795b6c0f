"""How candidates are compared side by side in one process: ``task=compare`` and the study's phases.

``compare.candidates`` are the head-to-head a user asks for, one string of space-separated knob
overrides each (``"compile.scope=regional amp.dtype=bfloat16"``); knobs a candidate does not name take
the command line's values, then the knob table's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from autocompile.config.choices import Knobs
from autocompile.config.knobs import KNOBS, KnobError
from autocompile.config.window_policy import WindowPolicy

MIN_PROCESSES = 3
"""Side-by-side processes a decision needs at least. A pair's interval is never narrower than its process means
allow (:func:`autocompile.study.statistics.intervals.paired_windows`): at 2 processes that is 1 degree of freedom,
mean +- 12.7 x se, so a process that moved by a few per cent leaves +-20-40 % (the H200 study's +9.2 % [-10.9,
+33.7]); at 3 it is t(2) = 4.3 (``tests/test_interval_simulations.py``)."""


@dataclass
class CompareSettings:
    """Side-by-side timing: several candidates in one process, window by window in rotating order."""

    candidates: list[str] = field(default_factory=list)
    """``task=compare``: one string of space-separated knob overrides per candidate; the first is the one
    every other is compared against. ``["compile.scope=none", "compile.scope=module"]``."""
    processes: int = 7
    """Fresh processes per comparison, in ``task=compare`` and in the study's phases (build and window
    order rotated in each): differences between processes widen the interval, so they are measured, not
    assumed away. They dominate once a process has timed a few dozen windows, so more, shorter processes
    narrow the interval more than longer ones (gpt2-tiny on 2 cores, three A/A runs each: 5 processes
    within +-2.4 %, 7 within +-1.1 %, in the same wall time; issue 26's compare7 records)."""
    window_steps: int = 10
    """Steps per timed window."""
    min_rounds: int = 12
    """Rounds (one window of each candidate) per process before the stopping rule is consulted."""
    precision: float = 0.01
    """A process stops once every candidate's paired 95% interval against the fastest is within this
    fraction inside it (0.01 = +-1%) ..."""
    max_timed_s: float = 10.0
    """... or once this many seconds of windows were timed in it."""
    settle_steps: int = 1
    """Untimed steps of a candidate before each of its windows (the switch between programs is not timed)."""

    def policy(self) -> WindowPolicy:
        """The windows of each side-by-side process."""
        return WindowPolicy(self.window_steps, self.min_rounds, self.precision, self.max_timed_s, self.settle_steps)

    @property
    def decided_processes(self) -> int:
        """The side-by-side processes run: ``processes``, at least :data:`MIN_PROCESSES`."""
        return max(self.processes, MIN_PROCESSES)

    def processes_note(self) -> str | None:
        """The one line saying that fewer processes than a decision needs were asked for (None: enough)."""
        if self.processes >= MIN_PROCESSES:
            return None
        return (f"compare.processes={self.processes}: a side-by-side decision needs {MIN_PROCESSES} processes (at "
                f"{self.processes} the interval has {max(self.processes - 1, 0)} df between processes), so "
                f"{MIN_PROCESSES} run")

    def __post_init__(self) -> None:
        for key, value, least in (("processes", self.processes, 1), ("window_steps", self.window_steps, 1),
                                  ("min_rounds", self.min_rounds, 2), ("settle_steps", self.settle_steps, 0)):
            if value < least:
                raise ValueError(f"compare.{key}={value} must be >= {least}")
        if not 0 < self.precision < 1 or self.max_timed_s <= 0:
            raise ValueError(f"compare.precision={self.precision} must be in (0, 1) and compare.max_timed_s="
                             f"{self.max_timed_s} > 0")
        for text in self.candidates:
            overrides(text)


def overrides(text: str) -> Knobs:
    """``"compile.scope=regional amp.dtype=bfloat16"`` -> knob values (YAML scalars: true, null, 3)."""
    found: Knobs = {}
    for part in str(text).split():
        key, sep, value = part.partition("=")
        if not sep or key not in KNOBS:
            raise KnobError(f"compare.candidates: {part!r} is no knob=value; a candidate is space-separated "
                            f"overrides such as 'compile.scope=regional amp.dtype=bfloat16' (knobs: "
                            f"{', '.join(KNOBS)})")
        found[key] = yaml.safe_load(value)
    return found


def label(text: str) -> str:
    """A candidate's name in tables: its overrides, or "command line" when it names none."""
    return " ".join(str(text).split()) or "command line"
