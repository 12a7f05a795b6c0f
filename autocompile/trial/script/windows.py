"""The script's steps as timed: the warm-up's step times, then windows of ``measure.window_steps`` steps with
their seconds, items, process CPU seconds and the time the script waited for its data loader; a window in which
dynamo compiled a frame was warm-up, and its time counts as compile.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import TypedDict

from autocompile.config.spec import MeasureSettings
from autocompile.trial.script.ranks import rank0_says, reduce_max
from autocompile.trial.timing.stats import relative_half_width
from autocompile.trial.timing.worker import CompileInTimedPart

log = logging.getLogger("autocompile.trial.script")
MAX_REWARM = 3
"""Windows thrown away for compiling before the trial fails as never reaching a steady state."""
LOADER_BOUND = 0.5
"""A window in which the script waited for its data loader this share of the time or more is loader-bound."""


class Window(TypedDict):
    """A timed window's ``window`` progress event."""

    window: int
    seconds: float
    step_s: float


class Timing(TypedDict):
    """The result's timing fields (``TrialResult``'s of the same names), every rank's slowest windows."""

    compile_s: float
    first_step_s: float
    warmup_step_s: list[float]
    step_s: float
    step_s_windows: list[float]
    step_cpu_s_windows: list[float]
    step_s_cv: float
    timed_precision: float | None
    timed_s: float
    windows: int
    tokens_per_s: float
    tokens_per_s_windows: list[float]
    rewarm_steps: int
    warmup_steps: int
    window_steps: int


class Loader(TypedDict):
    """The script's wait for its data loader (part of the result's ``script``)."""

    loader_wait_s_windows: list[float]
    loader_bound: bool


@dataclass
class Mark:
    """Where a window opened: its step and the running counts it is measured from."""

    step: int
    clock: float
    items: int
    frames: int
    cpu: float
    waited: float


class Windows:
    """The warm-up and the timed windows of one process (reduced over the ranks when read)."""

    def __init__(self, measure: MeasureSettings) -> None:
        self.measure = measure
        self.warm_s: list[float] = []
        self.window_s: list[float] = []
        self.window_items: list[int] = []
        self.window_cpu: list[float] = []
        """Process CPU seconds of each timed window (a descheduled window has far fewer than its wall seconds)."""
        self.window_waited: list[float] = []
        """Seconds of each timed window spent waiting for the script's data loader."""
        self.rewarm_s, self.rewarm_steps = 0.0, 0
        self.mark: Mark | None = None

    def open(self, step: int, items: int, frames: int, waited: float) -> None:
        self.mark = Mark(step, time.perf_counter(), items, frames, time.process_time(), waited)

    def close(self, step: int, items: int, compiled: float, waited: float) -> Window | None:
        """Close the open window at ``step``; ``compiled``: frames dynamo compiled in it (every rank's largest).
        Returns the window's progress record, or None when it was warm-up after all."""
        mark = self.mark
        assert mark is not None
        seconds = time.perf_counter() - mark.clock
        cpu = time.process_time() - mark.cpu
        if compiled:
            self.rewarm_s += seconds
            self.rewarm_steps += step - mark.step
            log.warning("%d frame(s) compiled during a timed window: timing again", int(compiled))
            if self.rewarm_steps > MAX_REWARM * self.measure.window_steps:
                raise CompileInTimedPart(f"frames compiled again in {MAX_REWARM + 1} timed windows: the script never "
                                         "reaches a steady state (see graph breaks/guards)")
            return None
        self.window_s.append(seconds)
        self.window_items.append(items - mark.items)
        self.window_cpu.append(cpu)
        self.window_waited.append(waited - mark.waited)
        return {"window": len(self.window_s) - 1, "seconds": seconds, "step_s": seconds / (step - mark.step)}

    def more(self) -> bool:
        """``measure.windows`` windows at least, then until ``measure.precision`` or ``measure.max_timed_s``
        (rank 0 decides for every rank: their steps are collective)."""
        m = self.measure
        if len(self.window_s) < m.windows:
            return True
        if not m.precision:
            return False
        return rank0_says(sum(self.window_s) < m.max_timed_s and relative_half_width(self.window_s) > m.precision)

    def timing(self, world_size: int, unit: str | None, warmup: int) -> Timing:
        """The result's timing fields: every rank's slowest window, the median step, compile time as the
        warm-up's excess over steady-state steps (``warmup`` steps, and the re-timed windows)."""
        per_window = self.measure.window_steps
        window_s = reduce_max(self.window_s)
        warm_s = reduce_max(self.warm_s)
        step_s = [t / per_window for t in window_s]
        median_step = statistics.median(step_s)
        compile_s = max(0.0, sum(warm_s) + self.rewarm_s - (warmup + self.rewarm_steps) * median_step)
        if unit is not None:
            rates = [n * world_size / t for n, t in zip(self.window_items, window_s, strict=True)]
        else:  # no forward seen: throughput in steps
            rates = [per_window / t for t in window_s]
        return {
            "compile_s": compile_s,
            "first_step_s": warm_s[0],
            "warmup_step_s": warm_s,
            "step_s": median_step,
            "step_s_windows": step_s,
            "step_cpu_s_windows": [t / per_window for t in reduce_max(self.window_cpu)],
            "step_s_cv": statistics.pstdev(step_s) / statistics.fmean(step_s),
            "timed_precision": relative_half_width(step_s) if len(step_s) > 1 else None,
            "timed_s": sum(window_s),
            "windows": len(window_s),
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_windows": rates,
            "rewarm_steps": self.rewarm_steps,
            "warmup_steps": warmup + self.rewarm_steps,
            "window_steps": per_window,
        }

    def loader(self) -> Loader:
        """How long each window waited for the script's data loader, and whether that bounds its speed."""
        waited = reduce_max(self.window_waited)
        shares = [w / t for w, t in zip(waited, reduce_max(self.window_s), strict=True)]
        return {"loader_wait_s_windows": waited,
                "loader_bound": bool(shares) and statistics.median(shares) >= LOADER_BOUND}
