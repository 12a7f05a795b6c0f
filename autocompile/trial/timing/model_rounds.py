"""The model path's driver of the timed windows: built candidates (one in a trial, several side by side) run their
windows in the rounds :class:`~autocompile.trial.timing.rounds.Rounds` schedules, timed by the one
:class:`~autocompile.trial.timing.clock.WindowClock`, reduced over the ranks before they are recorded.

On CUDA the windows' times are read (one synchronisation) only where the next decision needs them
(:meth:`WindowClock.before_deciding`). Torch only, like the workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from autocompile.config.knobs import TrialConfig
from autocompile.config.spec import TrialSpec
from autocompile.trial.program.build import (
    Built,
    append_progress,
    build_candidate,
    check_finite,
    period,
    stage,
    synchronize,
)
from autocompile.trial.timing.clock import WindowClock
from autocompile.trial.timing.ranks import reduce_max
from autocompile.trial.timing.readings import guard_failure_counts, recompile_reasons
from autocompile.trial.timing.recordings import compile_events
from autocompile.trial.timing.rounds import Rounds, Window

Progress = Callable[..., None]


class ModelProcess:
    """A model-path process (a trial, or candidates side by side): its directory, rank, device and timeline."""

    def __init__(self, out_dir: Path, rank: int, device: str, timeline: dict[str, float]) -> None:
        self.out_dir = out_dir
        self.rank = rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = torch.device(device)
        self.timeline = timeline
        if launched := os.environ.get("AUTOCOMPILE_LAUNCH_TIME"):
            self.timeline["launch"] = float(launched)
        self.staged: dict[str, list[tuple[Any, Any]]] = {}
        """Batches made once per workload (every candidate of a study has the same): :func:`stage`."""

    def build(self, spec: TrialSpec, config: TrialConfig) -> Built:
        """Candidate ``spec`` with ``config`` applied, on this process's device, its batches staged (none is made
        or copied while timing)."""
        built = build_candidate(spec, config, self.device, self.rank, self.world_size)
        key = json.dumps(asdict(spec.workload), sort_keys=True, default=str)
        if key not in self.staged:
            self.staged[key] = stage(built.data, period(spec), self.device)
        built.staged = self.staged[key]
        return built

    def progress(self, event: str, **data: Any) -> None:
        """A ``progress.jsonl`` event (rank 0): the tuner's stop rules and live view read them."""
        if self.rank == 0:
            append_progress(self.out_dir, event, **data)

    def sync(self) -> None:
        synchronize(self.device)


def time_rounds(rounds: Rounds, built: dict[int, Built], clock: WindowClock, progress: Progress,
                labels: list[str], scoped: Callable[[Built], AbstractContextManager[None]]) -> dict[int, str]:
    """Rounds until the scheduler stops (``scoped``: a candidate's process-global settings around its steps);
    returns why each candidate that compiled in too many windows failed."""
    policy = rounds.policy
    guards = guard_failure_counts()
    checked = {i: len(b.losses) for i, b in built.items()}
    failed: dict[int, str] = {}
    while rounds.more():
        batch: list[tuple[int, list[tuple[int, int, bool, int]]]] = []  # rounds: (candidate, window, compiled, items)
        for _ in range(clock.before_deciding(rounds.clean(), policy.min_rounds)):
            members = rounds.next_round()
            if not members:
                break
            batch.append((rounds.started - 1, [_window(built[i], i, clock, policy.settle_steps, policy.window_steps,
                                                       scoped) for i in members]))
        if not batch:
            break
        seconds = clock.resolve()
        for i, b in built.items():
            check_finite(b.losses[checked[i]:], b.steps_done)
            checked[i] = len(b.losses)
        # The slowest rank sets the pace of a synchronous job; the busiest rank's CPU: a window counts as
        # descheduled only when no rank kept working; a window compiled on any rank is dropped on all.
        values = iter(reduce_max([v for _, r in batch for _, k, c, _ in r
                                  for v in (seconds[k], clock.cpu_seconds[k], float(c))]))
        for q, r in batch:
            windows = {i: Window(next(values), next(values), bool(next(values)), items) for i, _, _, items in r}
            for i in rounds.record(windows):
                failed[i] = ("frames compiled or CUDA graphs recorded in more than "
                             f"{policy.rewarm_windows} timed windows: the step never reaches a steady state; failed "
                             f"guards: {'; '.join(recompile_reasons(guards)) or 'none (CUDA graphs re-recorded)'}")
            _tell(progress, q, rounds, windows, labels)
    return failed


def _window(b: Built, i: int, clock: WindowClock, settle: int, n: int,
            scoped: Callable[[Built], AbstractContextManager[None]]) -> tuple[int, int, bool, int]:
    with scoped(b):
        if settle:
            b.run(settle)
        before = compile_events()
        clock.start()
        items = b.run(n)
        k = clock.stop()
    return i, k, compile_events() != before, items


def _tell(progress: Progress, q: int, rounds: Rounds, windows: dict[int, Window], labels: list[str]) -> None:
    n = rounds.policy.window_steps
    if not rounds.alone:
        progress("round", round=q, step_s={labels[i]: w.seconds / n for i, w in windows.items()})
        return
    (c,) = rounds.of.values()
    (w,) = windows.values()
    if w.compiled:
        progress("rewarm", steps=c.rewarm_steps)
    else:
        progress("window", window=len(c.step_s) - 1, seconds=w.seconds, step_s=w.seconds / n)

