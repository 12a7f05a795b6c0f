"""The clock of the timed windows, one for the trial worker and the side-by-side worker.

CPU: the wall clock around each window, the device synchronised at both ends (a no-op there), each
window known as soon as it ends. CUDA: a timing event recorded on the current stream where each window
starts and stops, with no synchronisation in between; :meth:`WindowClock.resolve` synchronises once (on
the last event) and reads every pending window. A window closed by ``torch.cuda.synchronize`` pays a
pipeline fill (the GPU idles until the first kernel of the window is launched) and a drain (the CPU
idles until the last kernel ends), up to a step per window whichever of CPU and GPU is the slower; the
events mark positions in the stream, so a window's time is the GPU timeline between them, as a training
loop that never synchronises sees it. Callers decide (more windows?) only when they resolve: on CUDA
every few windows (:meth:`WindowClock.before_deciding`).

Beside each window's time, the process's CPU seconds over it (``time.process_time()``, every thread of the
process): a window that took long while the process did not run (descheduled) has CPU seconds far below
its wall seconds, one slow by the program's own work has both (:func:`autocompile.trial.timing.stats.descheduled`).
On CUDA they are the host's CPU seconds between the window's two event records (launches and waits), while
the window's time is the GPU's: a window the GPU alone made slower, its host waiting without spinning, would
read as descheduled (not checked on a GPU yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

LAZY_WINDOWS = 3
"""On CUDA, windows timed between two decisions once the minimum is reached: each decision synchronises."""


class WindowClock:
    """Seconds of windows: ``start()``, the window's work, ``stop()``; ``resolve()`` for every window so far."""

    def __init__(self, device: torch.device, sync: Callable[[], None]) -> None:
        self.events = device.type == "cuda"
        """Timing events, resolved at :meth:`resolve` (CUDA); else the wall clock, known at :meth:`stop`."""
        self.sync = sync
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        """Process CPU seconds of each window, known at :meth:`stop` (on CUDA too)."""
        self._cpu_started = 0.0
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started: torch.cuda.Event | float | None = None

    def start(self) -> None:
        if self._started is not None:
            raise RuntimeError("WindowClock.start() twice without stop()")
        if self.events:
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self.sync()
            self._started = time.perf_counter()
        self._cpu_started = time.process_time()

    def stop(self) -> int:
        """End the window; returns its index in :meth:`resolve`'s list."""
        started, self._started = self._started, None
        if started is None:
            raise RuntimeError("WindowClock.stop() without start()")
        if isinstance(started, float):
            self.sync()
            self.seconds.append(time.perf_counter() - started)
        else:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((started, end))
        self.cpu_seconds.append(time.process_time() - self._cpu_started)
        return len(self.seconds) + len(self._pending) - 1

    @property
    def pending(self) -> int:
        """Windows stopped whose time is not read yet."""
        return len(self._pending)

    def resolve(self) -> list[float]:
        """Every window's seconds so far (one synchronisation on CUDA when windows are pending)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.seconds.extend(start.elapsed_time(end) / 1e3 for start, end in self._pending)
            self._pending.clear()
        return self.seconds

    def before_deciding(self, done: int, minimum: int) -> int:
        """Windows to time before the next decision, ``done`` being timed: one at a time on the wall clock (as
        cheap as it gets); on CUDA the rest of the ``minimum`` at once, then :data:`LAZY_WINDOWS`."""
        if not self.events:
            return 1
        return minimum - done if done < minimum else LAZY_WINDOWS
