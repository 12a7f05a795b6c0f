"""The end of a script's measurement: the result written in the worker's shape and every rank ended, a failure
in one line, or the script ending before the measurement was complete.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, TypedDict

import torch
import torch.distributed as dist

from autocompile.config.script_settings import ScriptSpec
from autocompile.config.spec import write_json_atomic
from autocompile.trial.program.graphs import Program
from autocompile.trial.script.windows import Windows
from autocompile.trial.timing.compile_artifacts import save_artifacts
from autocompile.trial.timing.ranks import distributed, exit_now, reduce_max
from autocompile.trial.timing.readings import (
    CudaGraphsSkipped,
    check_cuda_graphs,
    classify,
    dynamo_compile_times,
    environment,
    loss_values,
    peak_memory,
    set_graphs,
)
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.turn import end_turn
from autocompile.workload.units import Structure


class CompileCall(TypedDict):
    """One ``torch.compile`` call of the script (the result's ``script.compile_calls``)."""

    target: str
    """The qualified name of what it compiled."""
    module: bool
    where: str
    """``train.py:120``."""
    kwargs: dict[str, str]
    """Its keyword arguments, each as ``repr``."""


class Prepared(TypedDict, total=False):
    """What ``autocompile.prepare`` applied, read back from the script's objects (the result's
    ``script.prepared``): every key, or none when the script never called it."""

    where: str
    optimizer: str | None
    """The optimizer's class name (None: none given)."""
    foreach: list[bool | None]
    """Each parameter group's ``foreach`` and ``fused`` (``optim.impl``)."""
    fused: list[bool | None]
    checkpointed: list[str]
    """The blocks ``ac.policy=block`` checkpointed."""


class CannotTakeOver(RuntimeError):
    """The script calls ``torch.compile`` in a way the trial's knobs cannot be applied to."""


SPAWNS = ("the script starts its training in torch.multiprocessing.spawn children, which the agent does not reach: "
          "start its ranks with torchrun instead (script.launcher=torchrun, workload.nproc_per_node=N, each rank "
          "reading RANK, LOCAL_RANK and WORLD_SIZE)")
"""Why a script that spawns its training processes is refused, as it spawns (its children would run the whole job)."""


class ScriptEnded(RuntimeError):
    """The script ended (or never stepped) before the measurement was complete."""


class Ending:
    """The meter's last acts (a part of :class:`~autocompile.trial.script.meter.Meter`)."""

    spec: ScriptSpec
    trial_dir: Path
    agent: Any
    rank: int
    world_size: int
    timeline: dict[str, float]
    windows: Windows
    steps: int
    step_kind: str
    first_steps: dict[int, tuple[float, int]]
    optimizers_built: int
    unit: str | None
    losses: list[torch.Tensor]
    program: Program | None
    warmup_peak: int
    memory_source: str
    before_s: float
    before_compile_s: float
    queued: int
    finished: bool

    def device(self) -> torch.device:
        raise NotImplementedError

    def progress(self, event: str, **data: Any) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Write the result, meet the other ranks, and end this process."""
        try:
            check_cuda_graphs(self.device())
        except CudaGraphsSkipped as exc:
            self.fail(exc)
            exit_now(1)
        self.finished = True
        self.timeline["timed_done"] = time.time()
        end_turn(self.rank, self.progress)
        result = self.result()
        if self.rank == 0:
            write_json_atomic(self.trial_dir / "result.json", result.to_json())
        if distributed():
            dist.barrier()
            dist.destroy_process_group()
        logging.shutdown()
        exit_now(0)

    def result(self) -> TrialResult:

        device = self.device()
        compiled = self.agent.compiles_anything
        before_s, before_compile_s = reduce_max([self.before_s, self.before_compile_s])
        program = self.program
        result = TrialResult(
            status="ok",
            compiled=list(self.agent.compiled),
            dynamo_compile_s=dynamo_compile_times(),
            throughput_unit=self.unit or ("backward() calls" if self.step_kind == "backward" else "optimizer steps"),
            recompiles_timed=0,
            compiled_coverage=program["coverage"] if program is not None else None,
            fingerprint=program["fingerprint"] if program is not None else None,
            losses=loss_values(self.losses),
            mfu=None,
            flops_per_token=None,
            compile_artifacts=save_artifacts(self.trial_dir) if self.rank == 0 and compiled else None,
            artifacts_loaded=None,
            script={"path": self.spec.script.path, "args": self.spec.script.args, "optimizer_steps": self.steps,
                    "step": self.step_kind, "compile_calls": self.agent.calls, "losses_seen": bool(self.losses),
                    "prepared": self.agent.prepared, "before_first_step_s": before_s,
                    "excluded_before_first_step_s": max(0.0, before_s - before_compile_s),
                    "loader_queue_drained_steps": self.queued, **self.windows.loader(),
                    "recompile_limit_hits": self.agent.limit_hits.hits,
                    "input_shapes": {part: {"x".join(map(str, shape)): n for shape, n in seen.items()}
                                     for part, seen in self.shapes.items()},
                    "backwards_per_step": self.backwards,
                    "structure": dataclasses.asdict(Structure.of(self.models[0])) if self.models else None},
            timeline=self.timeline,
            environment=environment(device, self.rank, torch.get_num_threads()),
        )
        self.windows.set_timing(result, self.world_size, self.unit is not None)
        assert result.compile_s is not None
        result.compile_s += before_compile_s  # what dynamo compiled for an evaluation before the first step
        set_graphs(result)
        # peak memory of the timed part and of the warm-up (the largest rank's)
        steady, warm = (int(v) for v in reduce_max([float(peak_memory(device)), float(self.warmup_peak)]))
        result.peak_memory_bytes, result.warmup_peak_memory_bytes = steady, warm
        result.memory_source = self.memory_source
        return result

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
        m = self.spec.measure
        if self.program is not None and self.windows.timed >= m.windows:
            # Ended while timing windows beyond the minimum (measure.precision not reached yet): its budget
            # ended, as measure.max_timed_s would have; the windows so far are the measurement.
            self.finish()
        self.fail(ScriptEnded(self.why_ended()))

    def why_ended(self) -> str:
        steps = self.steps or len(self.first_steps)
        if not steps and self.optimizers_built:
            return ("the script built an optimizer but never stepped it (torch.optim.Optimizer.step): step it, or "
                    "build none (a script with no optimizer steps at each backward())")
        if not steps:
            return "the script never called backward() nor stepped an optimizer: there are no training steps to time"
        m = self.spec.measure
        needed = max(2, m.warmup_steps) + self.queued + m.windows * m.window_steps
        extra = [why for why, more in (("more for late compiles", self.windows.rewarm_steps),
                                        (f"{self.queued} to drain its data loader's queue", self.queued)) if more]
        unit = "backward() calls" if self.step_kind == "backward" else "optimizer steps"
        return (f"the script stopped after {steps} {unit}; the measurement needs {needed}"
                f"{' (and ' + ', '.join(extra) + ')' if extra else ''}: raise its step budget (script.args)")
