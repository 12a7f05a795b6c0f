"""The script's steps as timed: the warm-up's step times, then windows taken at the script's step edges in the rounds
of the one scheduler (:class:`~autocompile.trial.timing.rounds.Rounds`) and timed by the one clock
(:class:`~autocompile.trial.timing.clock.WindowClock`). One driver for a script's process alone (one candidate: a
window a round) and side by side (several candidates, each round in rotating order, each window after
``settle_steps`` untimed steps of its candidate): each window has its items, CPU seconds, the time the script waited
for its data loader, and whether dynamo compiled a frame in it (warm-up after all: its round is dropped, its time
counts as compile).

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from autocompile.trial.timing.clock import WindowClock
from autocompile.trial.timing.ranks import reduce_max, sync, timed_device
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.rounds import Rounds, Window, set_timing

LOADER_BOUND = 0.5
"""A window in which the script waited for its data loader this share of the time or more is loader-bound."""


class Loader(TypedDict):
    """The script's wait for its data loader (part of the result's ``script``)."""

    loader_wait_s_windows: list[float]
    loader_bound: bool


@dataclass
class Mark:
    """The script's running counts at a step edge: a window is measured between two."""

    step: int
    items: int
    frames: int
    """Compile events so far."""
    waited: float
    """Seconds spent waiting for the script's data loader so far."""


class Windows:
    """The warm-up and the timed windows of one process (every rank's largest values)."""

    def __init__(self, rounds: Rounds, switch: Callable[[int], None] = lambda i: None) -> None:
        """``switch``: run candidate ``i`` from the next step (side by side; alone there is nothing to switch)."""
        self.rounds, self.switch = rounds, switch
        self.clock: WindowClock | None = None
        """Made at the first window (:func:`~autocompile.trial.timing.ranks.timed_device`)."""
        self.warm_s: list[float] = []
        self.waited: list[float] = []
        """Seconds of each kept window of a candidate alone spent waiting for the script's data loader."""
        self.members: list[int] = []
        self.position = 0
        self.settle_from: int | None = None
        """The step the active candidate's settling began (None: its window is open, or none is)."""
        self.mark: Mark | None = None
        """Where the open window opened (None: no window is open)."""
        self.this_round: dict[int, Window] = {}

    @property
    def timed(self) -> int:
        return len(self.rounds.of[self.rounds.live[0]].step_s) if self.rounds.live else 0

    @property
    def rewarm_steps(self) -> int:
        return max((c.rewarm_steps for c in self.rounds.of.values()), default=0)

    def begin_round(self, at: Mark) -> None:
        self.members, self.position, self.this_round = self.rounds.next_round(), 0, {}
        self._enter(at)

    def _enter(self, at: Mark) -> None:
        self.switch(self.members[self.position])
        self.settle_from = at.step
        if not self.rounds.policy.settle_steps:
            self._open(at)

    def _open(self, at: Mark) -> None:
        self.clock = self.clock or WindowClock(timed_device(), sync)
        self.settle_from, self.mark = None, at
        self.clock.start()

    def step(self, steps: int, counts: Callable[[], Mark]) -> list[int] | None:
        """After each step of the timed part (``steps`` so far; ``counts`` read only at a window's edges, not at
        every step inside it): settle, open or close a window, go on to the round's next candidate. Returns, once
        every member of the round has its window, the candidates that failed by it (compiled in too many
        windows); None while the round goes on."""
        p = self.rounds.policy
        if self.settle_from is not None:
            if steps - self.settle_from >= p.settle_steps:
                self._open(counts())
            return None
        mark = self.mark
        assert mark is not None and self.clock is not None
        if steps - mark.step < p.window_steps:
            return None
        at = counts()
        k = self.clock.stop()
        seconds, cpu, compiled, waited = reduce_max([self.clock.resolve()[k], self.clock.cpu_seconds[k],
                                                     float(at.frames - mark.frames), at.waited - mark.waited])
        i = self.members[self.position]
        self.this_round[i] = Window(seconds, cpu, bool(compiled), at.items - mark.items)
        self.mark, self.position = None, self.position + 1
        if self.position < len(self.members):
            self._enter(at)
            return None
        failed = self.rounds.record(self.this_round)
        if self.rounds.alone and not self.dropped:  # alone, the round's one window is this one
            self.waited.append(waited)
        return failed

    @property
    def dropped(self) -> bool:
        """The round just ended was warm-up after all (a frame compiled in one of its windows)."""
        return any(w.compiled for w in self.this_round.values())

    def set_timing(self, result: TrialResult, world_size: int, items: bool) -> None:
        """A candidate alone: the result's timing fields (:func:`~autocompile.trial.timing.rounds.set_timing`)."""
        set_timing(result, self.rounds.of[0], reduce_max(self.warm_s), len(self.warm_s),
                   self.rounds.policy.window_steps, world_size, items)

    def loader(self) -> Loader:
        """How long each window waited for the script's data loader, and whether that bounds its speed."""
        windows = [s * self.rounds.policy.window_steps for s in self.rounds.of[0].step_s]
        shares = [w / t for w, t in zip(self.waited, windows, strict=True)]
        return {"loader_wait_s_windows": self.waited,
                "loader_bound": bool(shares) and statistics.median(shares) >= LOADER_BOUND}
