"""One configuration made ready to time, in the process that times it: the model built from the seed,
the configuration applied, the warm-up run (this is where compilation happens) and the program checked.

Shared by the single-trial worker (:mod:`autocompile.trial.worker`) and the side-by-side worker
(:mod:`autocompile.trial.sidebyside`), so a configuration timed alone and one timed beside others are
the same code. Torch only: it runs where nothing else is installed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from autocompile.config.knobs import TrialConfig
from autocompile.config.spec import TrialSpec
from autocompile.trial.programs import listening, verify
from autocompile.trial.step import TrainStep, apply
from autocompile.workload.infer import model_facts
from autocompile.workload.models import build
from autocompile.workload.parts import build_data, build_loss, optimizer_factory, schedule_factory

Progress = Callable[..., None]


class NonFiniteLoss(RuntimeError):
    pass


def start_process(threads: int, device: torch.device, world_size: int) -> torch.device:
    """What every timing process sets before it builds anything: its threads, a recompile limit that
    fails loudly (a hit limit silently runs the rest eagerly), the process group of its ranks, and its
    own GPU. Returns the device with its index."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(threads)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.reset_peak_memory_stats()
    return device


def append_progress(directory: Any, event: str, **data: Any) -> None:
    """One line of ``progress.jsonl``, which the launcher reads while the process runs."""
    import json

    with open(directory / "progress.jsonl", "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **data}) + "\n")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclass
class Built:
    """A configuration applied to its own model, with its data and the losses it has produced."""

    config: TrialConfig
    model: torch.nn.Module
    step: TrainStep
    data: Callable[[int], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    facts: dict[str, Any]
    losses: list[torch.Tensor] = field(default_factory=list)
    steps_done: int = 0
    """Steps run so far: step ``i`` trains on batch ``i``, whatever ran in this process before."""
    warm_s: list[float] = field(default_factory=list)
    """Wall seconds of each warm-up step."""
    program: dict[str, Any] = field(default_factory=dict)
    """What :func:`autocompile.trial.programs.verify` found after the warm-up: coverage, fingerprint."""

    def run(self, n: int, sync: Callable[[], None] | None = None) -> int:
        """Run ``n`` steps on the next batches; returns the items (tokens, samples) they processed."""
        from autocompile.workload.data import count_items

        items = 0
        for _ in range(n):
            inputs, targets = self.data(self.steps_done)
            items += count_items(inputs)
            self.losses.append(self.step(inputs, targets))
            self.steps_done += 1
        if sync is not None:
            sync()
        return items


def build_candidate(spec: TrialSpec, config: TrialConfig, device: torch.device, rank: int,
                    world_size: int) -> Built:
    """The model from the workload's seed (every configuration gets identical weights and batches)
    with ``config`` applied."""
    workload = spec.workload
    torch.manual_seed(workload.seed)
    model = build(spec.model.target, spec.model.kwargs)
    facts = {**model_facts(model), **({"vocab_size": spec.model.vocab_size} if spec.model.vocab_size else {}),
             "batch_size": workload.batch_size, "seq_len": list(workload.seq_len), "seed": workload.seed,
             "rank": rank, "world_size": world_size, "device": device}
    data = build_data(workload.data, facts)
    loss_fn = build_loss(workload.loss)
    step = apply(model, optimizer_factory(workload.optimizer), loss_fn, config, device=device,
                 lr_schedule=schedule_factory(workload.lr_schedule), grad_clip_norm=workload.grad_clip_norm,
                 grad_accum_steps=workload.grad_accum_steps)
    return Built(config, model, step, data, loss_fn, facts)


def warmup_steps(spec: TrialSpec) -> int:
    """Every shape twice, so first compiles and the automatic-dynamic recompile land in the warm-up, and
    whole optimizer steps (twice when accumulating: micro-steps and the stepping one may compile apart). One
    step more when shapes vary: CUDA graph trees record a graph on its second call per shape, and the dynamic
    graph first sees the first shape on that shape's second round, so it is recorded on its third."""
    shapes, accum = len(spec.workload.seq_len), spec.workload.grad_accum_steps
    warmup = max(spec.measure.warmup_steps, 2 * shapes + int(shapes > 1), 2 * accum if accum > 1 else 1)
    return -(-warmup // accum) * accum


def window_steps(spec: TrialSpec, wanted: int) -> int:
    """``wanted`` rounded up so that every window runs each sequence length equally often and whole
    optimizer steps: windows then differ by noise only."""
    period = math.lcm(len(spec.workload.seq_len), spec.workload.grad_accum_steps)
    return -(-wanted // period) * period


def warm_up(built: Built, steps: int, sync: Callable[[], None], progress: Progress) -> None:
    """Run the warm-up steps one by one (timed each), then check which program was compiled. Inductor's cache
    keys are collected into this candidate's log while it compiles (here), and only then."""
    progress("warmup_start", steps=steps)
    with listening(built.step.log):
        for i in range(steps):
            sync()
            t0 = time.perf_counter()
            built.run(1)
            sync()
            built.warm_s.append(time.perf_counter() - t0)
            check_finite(built.losses[-1:], i)
            progress("warmup_step", step=i, seconds=built.warm_s[-1])
    built.program = verify(built.step, built.model, built.config.compile.scope)


def check_finite(losses: list[torch.Tensor], step: int) -> None:
    if not all(math.isfinite(float(x)) for x in losses):
        raise NonFiniteLoss(f"loss is not finite at step {step}")
