"""Measuring the user's own script from inside it: optimizer steps timed in windows, then every rank ended.

The script's optimizer steps are its steps (a global ``register_optimizer_step_post_hook``; the first optimizer
that steps is counted). The first ``measure.warmup_steps`` are warm-up, where compilation happens; then windows
of ``measure.window_steps`` steps are timed with the device synchronised at their edges, everything the script
does between steps inside them (its data loader, its logging, its evals). A window in which dynamo compiled a
frame is warm-up too and is timed again. Items are counted from what the compiled model's forward receives
(tokens: the first integer tensor's elements; samples: the first float tensor's rows), in grad mode only
(an eval is not training). Losses are the scalars the script calls ``backward()`` on, summed per step.

Right after the timed part, rank 0 writes ``result.json`` in the worker's shape, every rank meets at a barrier
and exits. A script that ends first, never steps, or raises, leaves a failed result that says so in one line.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import atexit
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autocompile.config.script_settings import ScriptSpec
from autocompile.config.spec import write_json_atomic
from autocompile.trial.program.build import append_progress
from autocompile.trial.program.graphs import NothingCompiled, PartiallyCompiled, coverage, listening
from autocompile.trial.timing.compile_artifacts import save_artifacts
from autocompile.trial.timing.readings import CudaGraphsSkipped, reset_peak_memory
from autocompile.trial.timing.recordings import cudagraph_recordings
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.stats import relative_half_width
from autocompile.trial.timing.worker import (
    CompileInTimedPart,
    classify,
    dynamo_compile_times,
    environment,
    exit_now,
    peak_memory,
    short_reason,
)

log = logging.getLogger("autocompile.trial.script")
MAX_REWARM = 3
"""Windows thrown away for compiling before the trial fails as never reaching a steady state."""


class CannotTakeOver(RuntimeError):
    """The script calls ``torch.compile`` in a way the trial's knobs cannot be applied to."""


class ScriptEnded(RuntimeError):
    """The script ended (or never stepped an optimizer) before the measurement was complete."""


class Meter:
    """Counts, times and reports the script's optimizer steps; one per process."""

    def __init__(self, spec: ScriptSpec, trial_dir: Path, agent: Any, boot: float) -> None:
        """``agent``: the ``script_agent.Agent`` whose compiled units, calls and scope the result reports."""
        self.spec, self.trial_dir, self.agent = spec, trial_dir, agent
        self.rank, self.world_size = agent.rank, agent.world_size
        # The script's own start-up (its imports, model, data) is "build": from the agent's start to its first
        # forward (or optimizer step), where the warm-up clock starts.
        self.timeline: dict[str, float] = {"worker_start": boot, "imports_done": time.time()}
        if launched := os.environ.get("AUTOCOMPILE_LAUNCH_TIME"):
            self.timeline["launch"] = float(launched)
        self.models: list[nn.Module] = []
        """What the script handed to torch.compile (the first is the model whose weights are counted)."""
        self.optimizer: int | None = None
        self.steps, self.items = 0, 0
        self.unit: str | None = None
        self.pending: list[torch.Tensor] = []
        self.losses: list[torch.Tensor] = []
        self.started: float | None = None
        self.last = 0.0
        self.warm_s: list[float] = []
        self.window_s: list[float] = []
        self.window_items: list[int] = []
        self.window_cpu: list[float] = []
        """Process CPU seconds of each timed window (a descheduled window has far fewer than its wall seconds)."""
        self.rewarm_s, self.rewarm_steps = 0.0, 0
        self.window: tuple[int, float, int, int, float] | None = None  # start step, clock, items, frames, CPU
        self.program: dict[str, Any] | None = None
        self.warmup_peak, self.memory_source = 0, ""
        self.finished = False
        self._listening = listening(agent.log)

    # -- hooks ------------------------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._listening.__enter__()  # inductor's cache keys, for the fingerprint, until the warm-up ends
        register_optimizer_step_post_hook(torch._dynamo.disable(self.on_step))
        real_backward = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1 and not self.finished:
                self.pending.append(tensor.detach())
            return real_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]
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
            runner.register_forward_pre_hook(torch._dynamo.disable(self.on_forward), with_kwargs=True)

    def on_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.start_clock()
        if not torch.is_grad_enabled() or self.finished:
            return
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dim() > 0:
                self.items += value.numel()
                self.unit = "tokens"
                return
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                self.items += value.shape[0]
                self.unit = "samples"
                return

    def start_clock(self) -> None:
        if self.started is None:
            self.started = self.last = time.perf_counter()
            self.timeline["build_done"] = time.time()
            self.progress("warmup_start")

    def on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.finished:
            return
        if self.optimizer is None:
            self.optimizer = id(optimizer)
        if id(optimizer) != self.optimizer:
            return  # a second optimizer (a GAN's): the first one's steps are the script's steps
        self.start_clock()
        self.steps += 1
        if self.pending:
            self.losses.append(torch.stack([t.float().reshape(()) for t in self.pending]).sum())
            self.pending = []
        warmup, per_window = self.spec.measure.warmup_steps, self.spec.measure.window_steps
        if self.steps <= warmup:
            self.sync()
            now = time.perf_counter()
            self.warm_s.append(now - self.last)
            self.last = now
            self.progress("warmup_step", step=self.steps, seconds=self.warm_s[-1])
            if self.steps == warmup:
                self.check_program()
                self.reset_memory()
                self.open_window()
            return
        assert self.window is not None
        if self.steps - self.window[0] < per_window:
            return
        self.close_window()
        if self.more_windows():
            self.open_window()
        else:
            self.finish()

    # -- windows ----------------------------------------------------------------------------------------------
    def open_window(self) -> None:
        self.sync()
        self.window = (self.steps, time.perf_counter(), self.items, self.frames(), time.process_time())

    def reset_memory(self) -> None:
        """Steady-state peak memory from here, as the worker reads it: compile-time buffers of the warm-up apart."""
        self.warmup_peak = peak_memory(self.device())
        self.memory_source = reset_peak_memory(self.device())
        self.timeline["memory_reset"] = time.time()

    def close_window(self) -> None:
        self.sync()
        start, t0, items, frames, cpu0 = self.window  # type: ignore[misc]
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        compiled = self.agree(float(self.frames() - frames))
        if compiled:
            # Compile work in the timed part: the window was warm-up; its time counts as compile.
            self.rewarm_s += seconds
            self.rewarm_steps += self.steps - start
            self.progress("rewarm", frames=int(compiled))
            log.warning("%d frame(s) compiled during a timed window: timing again", int(compiled))
            if self.rewarm_steps > MAX_REWARM * self.spec.measure.window_steps:
                raise CompileInTimedPart(f"frames compiled again in {MAX_REWARM + 1} timed windows: the script never "
                                         "reaches a steady state (see graph breaks/guards)")
            return
        self.window_s.append(seconds)
        self.window_items.append(self.items - items)
        self.window_cpu.append(cpu)
        self.progress("window", window=len(self.window_s) - 1, seconds=seconds,
                      step_s=seconds / (self.steps - start))

    def more_windows(self) -> bool:
        """``measure.windows`` windows at least, then until ``measure.precision`` or ``measure.max_timed_s``
        (rank 0 decides for every rank: their steps are collective)."""
        m = self.spec.measure
        if len(self.window_s) < m.windows:
            return True
        if not m.precision:
            return False
        more = sum(self.window_s) < m.max_timed_s and relative_half_width(self.window_s) > m.precision
        if self.distributed():
            flag = torch.tensor([float(more)], device=self.collective_device())
            dist.broadcast(flag, src=0)
            more = bool(flag.item())
        return more

    def check_program(self) -> None:
        """After warm-up: what the trial asked to compile ran compiled (every unit inside a graph), or raise."""
        self._listening.__exit__(None, None, None)
        agent = self.agent
        if (unmet := agent.unmet()) is not None:  # a program other than the trial's: fail saying why
            raise CannotTakeOver(unmet)
        prepared = agent.prepared_knobs()  # programs that differ only in what prepare() applied differ here
        if not agent.compiles_anything:
            self.program = {"coverage": 0.0, "fingerprint": "eager:script" + "".join(
                f":{k}={v}" for k, v in sorted(prepared.items()))}
        elif not agent.calls or not self.models:
            raise NothingCompiled(f"compile.scope={agent.scope}, but the script never called torch.compile on a "
                                  "model (nothing to take over): add model = torch.compile(model) to it")
        else:
            cover = coverage(agent.log, self.models[0], agent.units)
            if not agent.log.graphs:
                raise NothingCompiled(f"{', '.join(agent.compiled)} handed to torch.compile, but no graph was "
                                      "compiled (dynamo skipped every frame)")
            if cover.missing:
                raise PartiallyCompiled(f"{', '.join(cover.missing[:6])} handed to torch.compile but ran eager")
            self.program = {"coverage": cover.fraction,
                            "fingerprint": agent.log.fingerprint({"scope": agent.scope, "script": True, **prepared})}
        self.timeline["warmup_done"] = time.time()
        self.progress("compiled", **self.program)

    # -- the end ----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Write the result, meet the other ranks, and end this process."""
        from torch._dynamo.utils import counters

        if self.device().type == "cuda" and counters["inductor"]["cudagraph_skips"]:
            self.fail(CudaGraphsSkipped(f"inductor skipped CUDA graphs {counters['inductor']['cudagraph_skips']} "
                                        "time(s): the mode ran as another program (see the script's stderr)"))
            exit_now(1)
        self.finished = True
        self.timeline["timed_done"] = time.time()
        result = self.result()
        if self.rank == 0:
            write_json_atomic(self.trial_dir / "result.json", result.to_json())
        if self.distributed():
            dist.barrier()
            dist.destroy_process_group()
        logging.shutdown()
        exit_now(0)

    def result(self) -> TrialResult:
        from torch._dynamo.utils import counters

        per_window = self.spec.measure.window_steps
        window_s = self.reduce_max(self.window_s)
        warm_s = self.reduce_max(self.warm_s)
        step_s = [t / per_window for t in window_s]
        median_step = statistics.median(step_s)
        warmup = self.spec.measure.warmup_steps
        compile_s = max(0.0, sum(warm_s) + self.rewarm_s - (warmup + self.rewarm_steps) * median_step)
        if self.unit is not None:
            rates = [n * self.world_size / t for n, t in zip(self.window_items, window_s, strict=True)]
        else:  # no forward seen: throughput in optimizer steps
            rates = [per_window / t for t in window_s]
        device = self.device()
        compiled = self.agent.compiles_anything
        return TrialResult(**{
            "status": "ok",
            "compiled": list(self.agent.compiled),
            "compile_s": compile_s,
            "first_step_s": warm_s[0],
            "warmup_step_s": warm_s,
            "dynamo_compile_s": dynamo_compile_times(),
            "step_s": median_step,
            "step_s_windows": step_s,
            "step_cpu_s_windows": [t / per_window for t in self.reduce_max(self.window_cpu)],
            "step_s_cv": statistics.pstdev(step_s) / statistics.fmean(step_s),
            "timed_precision": relative_half_width(step_s) if len(step_s) > 1 else None,
            "timed_s": sum(window_s),
            "windows": len(window_s),
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_windows": rates,
            "throughput_unit": self.unit or "optimizer steps",
            **self.memory(device),
            "graph_count": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "graph_break_reasons": {short_reason(k): v for k, v in counters["graph_break"].items()},
            "recompiles_timed": 0,
            "rewarm_steps": self.rewarm_steps,
            "compiled_coverage": (self.program or {}).get("coverage"),
            "fingerprint": (self.program or {}).get("fingerprint"),
            "losses": [float(x) for x in torch.stack(self.losses).cpu().tolist()] if self.losses else None,
            "warmup_steps": warmup + self.rewarm_steps,
            "window_steps": per_window,
            "mfu": None,
            "flops_per_token": None,
            "compile_artifacts": save_artifacts(self.trial_dir) if self.rank == 0 and compiled else None,
            "artifacts_loaded": None,
            "script": {"path": self.spec.script.path, "args": self.spec.script.args, "optimizer_steps": self.steps,
                       "compile_calls": self.agent.calls, "losses_seen": bool(self.losses),
                       "prepared": self.agent.prepared},
            "timeline": self.timeline,
            "environment": environment(device, self.rank, torch.get_num_threads()),
        })

    def memory(self, device: torch.device) -> dict[str, Any]:
        """Peak memory of the timed part and of the warm-up (the largest rank's)."""
        steady, warm = (int(v) for v in self.reduce_max([float(peak_memory(device)), float(self.warmup_peak)]))
        return {"peak_memory_bytes": steady, "warmup_peak_memory_bytes": warm, "memory_source": self.memory_source}

    def fail(self, exc: BaseException) -> None:
        """The script raised (from its own code or from the agent's checks inside its steps): a failed result."""
        if self.finished:
            return
        self.finished = True
        failure = classify(exc)
        if isinstance(exc, CannotTakeOver):
            failure["failure"] = "cannot_take_over"
        elif isinstance(exc, ScriptEnded):
            failure = {"failure": "script_ended", "reason": str(exc)}
        payload = TrialResult.failed(failure, self.rank, environment(None, self.rank), optimizer_steps=self.steps)
        write_json_atomic(self.trial_dir / ("result.json" if self.rank == 0 else f"error.rank{self.rank}.json"),
                          payload.to_json())

    def at_exit(self) -> None:
        """The script ended on its own before the measurement was complete."""
        if self.finished:
            return
        if self.program is not None and len(self.window_s) >= self.spec.measure.windows:
            # Ended while timing windows beyond the minimum (measure.precision not reached yet): its budget
            # ended, as measure.max_timed_s would have; the windows so far are the measurement.
            self.finish()
        needed = self.spec.needed_steps
        if not self.steps:
            why = ("the script never stepped an optimizer (torch.optim.Optimizer.step): there are no steps to "
                   "time")
        else:
            why = (f"the script stopped after {self.steps} optimizer steps; the measurement needs {needed}"
                   f"{' (and more for late compiles)' if self.rewarm_steps else ''}: raise its step budget "
                   "(script.args)")
        self.fail(ScriptEnded(why))

    # -- helpers ----------------------------------------------------------------------------------------------
    def progress(self, event: str, **data: Any) -> None:
        if self.rank == 0:
            append_progress(self.trial_dir, event, **data)

    def frames(self) -> int:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"]) + cudagraph_recordings()  # a CUDA-graph recording is compile work

    def device(self) -> torch.device:
        if self.spec.device == "cuda" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def sync(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def collective_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device(
            "cpu")

    def agree(self, value: float) -> float:
        """The largest ``value`` over the ranks: every rank takes the same branch."""
        return self.reduce_max([value])[0]

    def reduce_max(self, values: list[float]) -> list[float]:
        if not self.distributed():
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()
