"""Measuring the user's own script from inside it: its steps timed in windows, then every rank ended.

A step of the script is a step of the optimizer it steps every iteration: the first optimizer to step twice
(a GAN's two optimizers step alike; an auxiliary one stepped every k iterations, or once, is not the step),
and a ``GradScaler.step`` that skipped that optimizer for inf/NaN gradients is a step too. A script that
builds no ``torch.optim`` optimizer (its update by hand, ``p.data.add_(p.grad, alpha=-lr)``) steps at each
``backward()``. The warm-up, where compilation happens, lasts ``measure.warmup_steps`` steps (two at least:
the step is known at the second), and as many more as the script's data loader's workers may hold ready (a
long compile lets them fill their queue, which the first windows would drain); then windows of
``measure.window_steps`` steps are timed with the device synchronised at their edges, everything the script
does between steps inside them (its data loader, its logging, its evals), the time it waits for its loader
kept apart too. A window in which dynamo compiled a frame is warm-up too and is timed again. The warm-up clock
starts at the first training forward (or backward, or step): an evaluation before it (nanoGPT's at step 0) is
not compile time, save what dynamo spent compiling for it. Items are counted from what the compiled model's
forward receives (tokens: the first integer tensor's elements; samples: the first float tensor's rows), in
grad mode only (an eval is not training). Losses are the scalars the script calls ``backward()`` on, summed
per step.

Right after the timed part, rank 0 writes ``result.json`` in the worker's shape, every rank meets at a barrier
and exits. A script that ends first, never steps, or raises, leaves a failed result that says so in one line.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from autocompile.config.script_settings import ScriptSpec
from autocompile.trial.program.build import append_progress
from autocompile.trial.program.graphs import Program, listening
from autocompile.trial.script import hooks
from autocompile.trial.script.ending import SPAWNS, CannotTakeOver, Ending
from autocompile.trial.script.variants import script_program
from autocompile.trial.script.windows import Mark, Windows
from autocompile.trial.timing.ranks import device_of, sync
from autocompile.trial.timing.readings import (
    CompileInTimedPart,
    dynamo_compile_times,
    peak_memory,
    reset_peak_memory,
)
from autocompile.trial.timing.recordings import compile_events
from autocompile.trial.timing.rounds import Rounds
from autocompile.trial.timing.shape_state import SHAPE_STATE_FILE, save_shape_state
from autocompile.trial.timing.turn import wait_turn

log = logging.getLogger("autocompile.trial.script")


def step_loss(parts: list[torch.Tensor]) -> torch.Tensor:
    """A step's loss: the scalars the script called ``backward()`` on in it, summed (accumulated micro-batches)."""
    return torch.stack([t.float().reshape(()) for t in parts]).sum()


class Meter(Ending):
    """Counts, times and reports the script's steps; one per process."""

    def __init__(self, spec: ScriptSpec, trial_dir: Path, agent: Any, boot: float) -> None:
        """``agent``: the ``script_agent.Agent`` whose compiled units, calls and scope the result reports."""
        self.spec, self.trial_dir, self.agent = spec, trial_dir, agent
        self.rank, self.world_size = agent.rank, agent.world_size
        # The script's own start-up (its imports, model, data) is "build": from the agent's start to its first
        # forward (or step), where the warm-up clock starts.
        self.timeline: dict[str, float] = {"worker_start": boot, "imports_done": time.time()}
        if launched := os.environ.get("AUTOCOMPILE_LAUNCH_TIME"):
            self.timeline["launch"] = float(launched)
        self.models: list[nn.Module] = []
        """What the script handed to torch.compile (the first is the model whose weights are counted)."""
        self.step_kind: Literal["undecided", "optimizer", "backward"] = "undecided"
        self.optimizer: int | None = None
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        """Every optimizer stepped until the program is checked (a GAN's two): the coverage counts their weights."""
        self.first_steps: dict[int, tuple[float, int]] = {}
        """Each optimizer's first step until one steps again: its clock and the losses pending before it."""
        self.optimizers_built = 0
        self.steps, self.items = 0, 0
        self.unit: str | None = None
        self.pending: list[torch.Tensor] = []
        self.losses: list[torch.Tensor] = []
        self.first_forward: float | None = None
        self.started: float | None = None
        self.before_s = self.before_compile_s = 0.0
        self.last = 0.0
        self.waited, self.queued = 0.0, 0
        self.shapes: dict[str, Counter[torch.Size]] = {"warmup": Counter(), "timed": Counter()}
        """Training forwards by the shape of the input counted: what the timing covered (a curriculum that grows its
        sequences later is timed at the shapes it had here, which the result says)."""
        self.backwards = 0
        """The most ``backward()`` calls before one step: over 1, the script accumulates gradients."""
        self.window_shapes: Counter[torch.Size] = Counter()
        """The open window's: timed once it closes, warm-up if it compiled (timed again)."""
        self.windows = Windows(Rounds([0], spec.measure.policy(spec.measure.window_steps)))
        self.program: Program | None = None
        self.warmup_peak, self.memory_source = 0, ""
        self.finished = False
        self._listening = listening(agent.log)

    # -- what the hooks tell ----------------------------------------------------------------------------------
    def install(self) -> None:
        self._listening.__enter__()  # inductor's cache keys, for the fingerprint, until the warm-up ends
        hooks.install(self)
        previous = sys.excepthook

        def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            self.fail(exc)
            previous(kind, exc, tb)

        sys.excepthook = excepthook
        atexit.register(self.at_exit)
        self.progress("started")

    def watch(self, runner: nn.Module, model: nn.Module) -> None:
        """Count items from the forward calls of ``runner`` (what the script calls); ``model`` its weights."""
        self.models.append(model)
        if len(self.models) == 1:
            hooks.watch_forward(runner)

    def on_spawn(self) -> None:
        """``mp.spawn`` before any step here: the training runs in children the agent does not reach."""
        if not (self.steps or self.first_steps or self.finished):
            raise CannotTakeOver(SPAWNS)

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.first_forward is None:
            self.first_forward = time.perf_counter()
            self.timeline["build_done"] = time.time()
        if not torch.is_grad_enabled() or self.finished:
            return  # an evaluation: before the first step it is no warm-up, within a window it is timed
        self.start_clock()
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tokens = not value.is_floating_point()
                self.items += value.numel() if tokens else value.shape[0]
                self.unit = "tokens" if tokens else "samples"
                seen = self.window_shapes if self.windows.rounds.started else self.shapes["warmup"]
                seen[value.shape] += 1  # formatted once, in the result: this runs at every training forward
                return

    def on_backward(self, loss: torch.Tensor) -> None:
        if self.step_kind == "undecided" and not self.optimizers_built:
            self.step_kind = "backward"  # no torch.optim optimizer: the script updates by hand after backward()
        self.start_clock()
        self.pending.append(loss.detach())

    def after_backward(self) -> None:
        if self.step_kind == "backward" and not self.finished:
            self.count_step()

    def on_optimizer_built(self) -> None:
        self.optimizers_built += 1

    def on_batch(self, waited: float, queued: int) -> None:
        self.waited += waited
        self.queued = max(self.queued, queued)

    def on_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.finished or self.step_kind == "backward":
            return
        self.start_clock()
        key = id(optimizer)
        if self.program is None:
            self.optimizers.setdefault(key, optimizer)
        if self.step_kind == "optimizer":
            if key == self.optimizer:
                self.count_step()
            return
        sync()
        now = time.perf_counter()
        if key not in self.first_steps:
            self.first_steps[key] = (now, len(self.pending))
            return
        # The first optimizer to step again is the one stepped every iteration: its two steps are the first two.
        self.step_kind, self.optimizer = "optimizer", key
        first, before = self.first_steps[key]
        assert self.started is not None
        self.windows.warm_s = [first - self.started, now - first]
        self.last = now
        for part in (self.pending[:before], self.pending[before:]):
            if part:
                self.losses.append(step_loss(part))
        self.pending = []
        self.steps = 2
        for step, seconds in enumerate(self.windows.warm_s, 1):
            self.progress("warmup_step", step=step, seconds=seconds)
        self.end_warmup()

    # -- steps and windows ------------------------------------------------------------------------------------
    def start_clock(self) -> None:
        if self.started is not None:
            return
        sync()  # an evaluation's queued device work is not the first step's
        self.started = self.last = time.perf_counter()
        if self.first_forward is None:
            self.first_forward = self.started
            self.timeline["build_done"] = time.time()
        # Time between the first forward and the first training one (an evaluation at step 0) is not warm-up;
        # what dynamo compiled in it is compile time all the same.
        self.before_s = self.started - self.first_forward
        self.before_compile_s = min(self.before_s, dynamo_compile_times().get("_compile.compile_inner", 0.0))
        if self.rank == 0 and self.spec.rotation is None:  # for this candidate's turn beside others
            save_shape_state(self.trial_dir / SHAPE_STATE_FILE, self.models)
        self.progress("warmup_start")

    def count_step(self) -> None:
        self.start_clock()
        self.steps += 1
        self.backwards = max(self.backwards, len(self.pending))
        if self.pending:
            self.losses.append(step_loss(self.pending))
            self.pending = []
        w = self.windows
        if not w.rounds.started:  # warm-up
            sync()
            now = time.perf_counter()
            w.warm_s.append(now - self.last)
            self.last = now
            self.progress("warmup_step", step=self.steps, seconds=w.warm_s[-1])
            self.end_warmup()
            return
        self.take_windows()

    def take_windows(self) -> None:
        """After a step of the timed part: the windows of the one driver; at a round's end, what it found, then the
        next round or the end."""
        failed = self.windows.step(self.steps, self.at)
        if failed is None:
            return
        self.round_done(failed)
        if self.windows.rounds.more():
            self.windows.begin_round(self.at())
        else:
            self.finish()

    def round_done(self, failed: list[int]) -> None:
        """Alone: a window kept (its shapes timed), or warm-up after all (timed again; a third time fails)."""
        w = self.windows
        if failed:
            raise CompileInTimedPart(f"frames compiled again in {w.rounds.of[0].compiled} timed windows: the "
                                     "script never reaches a steady state (see graph breaks/guards)")
        self.shapes["warmup" if w.dropped else "timed"].update(self.window_shapes)
        self.window_shapes.clear()
        if w.dropped:
            log.warning("frame(s) compiled during a timed window: timing again")
            self.progress("rewarm", steps=w.rewarm_steps)
        else:
            step_s = w.rounds.of[0].step_s[-1]
            self.progress("window", window=w.timed - 1, seconds=step_s * w.rounds.policy.window_steps, step_s=step_s)

    def warmup_target(self) -> int:
        """Steps of warm-up: the settings', and one for each batch the loader's workers may hold ready."""
        return self.spec.measure.warmup_steps + self.queued

    def end_warmup(self) -> None:
        if self.step_kind == "undecided" or self.steps < self.warmup_target():
            return
        self.check_program()
        wait_turn(self.trial_dir, self.rank, self.progress)  # the device alone from here: other trials paused
        self.reset_memory()
        self.windows.begin_round(self.at())

    def at(self) -> Mark:
        """The running counts at this step edge."""
        return Mark(self.steps, self.items, compile_events(), self.waited)

    def reset_memory(self) -> None:
        """Steady-state peak memory from here, as the worker reads it: compile-time buffers of the warm-up apart."""
        self.warmup_peak = peak_memory(self.device())
        self.memory_source = reset_peak_memory(self.device())
        self.timeline["memory_reset"] = time.time()

    def check_program(self) -> None:
        """After warm-up: what the trial asked to compile ran compiled (every unit inside a graph), or raise."""
        self._listening.__exit__(None, None, None)
        agent = self.agent
        if (unmet := agent.unmet()) is not None:  # a program other than the trial's: fail saying why
            raise CannotTakeOver(unmet)
        prepared = agent.prepared_knobs()  # programs that differ only in what prepare() applied differ here
        self.program = script_program(agent.log, agent.scope, agent.units, agent.compiled, agent.functions,
                                      self.models, self.trained_weights(), len(agent.calls), prepared)
        self.timeline["warmup_done"] = time.time()
        self.progress("compiled", **self.program)

    def trained_weights(self) -> list[torch.Tensor]:
        """The parameters of every optimizer the script stepped in its warm-up: what its coverage counts."""
        return [p for o in self.optimizers.values() for group in o.param_groups for p in group["params"]]

    # -- helpers ----------------------------------------------------------------------------------------------
    def progress(self, event: str, **data: Any) -> None:
        if self.rank == 0:
            append_progress(self.trial_dir, event, **data)

    def device(self) -> torch.device:
        return device_of(self.spec.device)
