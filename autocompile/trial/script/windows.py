"""The script's steps as timed: the warm-up's step times, then windows of ``measure.window_steps`` steps scheduled
by the one scheduler (:class:`~autocompile.trial.timing.rounds.Rounds`, one candidate) and timed by the one clock
(:class:`~autocompile.trial.timing.clock.WindowClock`), with their items, CPU seconds and the time the script
waited for its data loader; a window in which dynamo compiled a frame was warm-up, and its time counts as compile.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import TypedDict

from autocompile.config.spec import MeasureSettings
from autocompile.trial.timing.clock import WindowClock
from autocompile.trial.timing.ranks import reduce_max, sync, timed_device
from autocompile.trial.timing.readings import CompileInTimedPart
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.rounds import Rounds, Window, set_timing

log = logging.getLogger("autocompile.trial.script")
LOADER_BOUND = 0.5
"""A window in which the script waited for its data loader this share of the time or more is loader-bound."""


class Loader(TypedDict):
    """The script's wait for its data loader (part of the result's ``script``)."""

    loader_wait_s_windows: list[float]
    loader_bound: bool


@dataclass
class Mark:
    """Where a window opened: its step and the running counts it is measured from."""

    step: int
    items: int
    frames: int
    waited: float


class Windows:
    """The warm-up and the timed windows of one process (every rank's largest values)."""

    def __init__(self, measure: MeasureSettings) -> None:
        self.rounds = Rounds([0], measure.policy(measure.window_steps))
        self.clock: WindowClock | None = None
        """Made at the first window (:func:`~autocompile.trial.timing.ranks.timed_device`)."""
        self.warm_s: list[float] = []
        self.waited: list[float] = []
        """Seconds of each kept window spent waiting for the script's data loader."""
        self.mark: Mark | None = None

    @property
    def timed(self) -> int:
        return len(self.rounds.of[0].step_s)

    @property
    def rewarm_steps(self) -> int:
        return self.rounds.of[0].rewarm_steps

    def open(self, step: int, items: int, frames: int, waited: float) -> None:
        self.rounds.next_round()
        self.clock = self.clock or WindowClock(timed_device(), sync)
        self.clock.start()
        self.mark = Mark(step, items, frames, waited)

    def close(self, step: int, items: int, frames: int, waited: float) -> bool:
        """Close the open window at ``step`` (``frames``: compile events so far); False when it was warm-up after
        all (frames compiled in it on any rank)."""
        mark = self.mark
        assert mark is not None and self.clock is not None
        k = self.clock.stop()
        seconds, cpu, compiled, waited = reduce_max([self.clock.resolve()[k], self.clock.cpu_seconds[k],
                                                     float(frames - mark.frames), waited - mark.waited])
        if self.rounds.record({0: Window(seconds, cpu, bool(compiled), items - mark.items)}):
            raise CompileInTimedPart(f"frames compiled again in {self.rounds.of[0].compiled} timed windows: the "
                                     "script never reaches a steady state (see graph breaks/guards)")
        if compiled:
            log.warning("%d frame(s) compiled during a timed window: timing again", int(compiled))
            return False
        self.waited.append(waited)
        return True

    def set_timing(self, result: TrialResult, world_size: int, items: bool) -> None:
        """The result's timing fields (:func:`~autocompile.trial.timing.rounds.set_timing`)."""
        set_timing(result, self.rounds.of[0], reduce_max(self.warm_s), len(self.warm_s),
                   self.rounds.policy.window_steps, world_size, items)

    def loader(self) -> Loader:
        """How long each window waited for the script's data loader, and whether that bounds its speed."""
        windows = [s * self.rounds.policy.window_steps for s in self.rounds.of[0].step_s]
        shares = [w / t for w, t in zip(self.waited, windows, strict=True)]
        return {"loader_wait_s_windows": self.waited,
                "loader_bound": bool(shares) and statistics.median(shares) >= LOADER_BOUND}
