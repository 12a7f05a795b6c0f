"""When a timed process times its windows and when it stops: one declaration for every timed process (a model
trial, a side-by-side process of the model path, a script's process alone or side by side), read by the one
scheduler of windows (:class:`autocompile.trial.timing.rounds.Rounds`).

Standard library only: it travels in the specs the trial processes read.
"""

from __future__ import annotations

from dataclasses import dataclass

REWARM_WINDOWS = 2
"""Timed windows a candidate may compile in (a shape, a guard the warm-up did not see) before it fails as
``compile_in_timed_part``: each is dropped (for every candidate, side by side) and its time counted as compile."""


@dataclass(frozen=True)
class WindowPolicy:
    """The windows of one timed process: their length, their minimum, and the stopping rule."""

    window_steps: int
    """Steps per timed window (rounded up to whole optimizer steps and every sequence length by the driver)."""
    min_rounds: int
    """Rounds (one window of every candidate each) that count before the stopping rule is consulted."""
    precision: float
    """Stop once every candidate's 95 % interval (against the fastest, side by side; its own mean, alone) has a
    half-width within this fraction of it; 0: exactly ``min_rounds`` rounds."""
    max_timed_s: float
    """... or once this many seconds of windows were timed (three times that while the minimum is not reached)."""
    settle_steps: int = 0
    """Untimed steps of a candidate before each of its windows (the switch from another program is not timed)."""
    rewarm_windows: int = REWARM_WINDOWS
    """Windows a candidate may compile in before it fails (:data:`REWARM_WINDOWS`)."""
