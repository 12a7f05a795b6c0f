"""One configuration made ready to time, in the process that times it: the model built from the seed,
the configuration applied, the warm-up run (this is where compilation happens) and the program checked.

Shared by the single-trial worker (:mod:`autocompile.trial.timing.worker`) and the side-by-side worker
(:mod:`autocompile.trial.timing.sidebyside_worker`), so a configuration timed alone and one timed beside others are
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
from autocompile.config.torch_private import dynamo_config
from autocompile.trial.program.graphs import Program, listening, verify
from autocompile.trial.program.step import TrainStep, apply
from autocompile.workload.infer import model_facts
from autocompile.workload.models import build
from autocompile.workload.parts import DataFacts, build_data, build_loss, optimizer_factory, schedule_factory

Progress = Callable[..., None]


class NonFiniteLoss(RuntimeError):
    pass


STAGED_STEPS = 64
"""Steps of batches made before the warm-up and kept on the device (a ring: step ``i`` trains on batch
``i % len``); fewer when their bytes pass :data:`STAGED_BYTES`, never less than one period."""
STAGED_BYTES = 256 * 2**20
"""Bytes the staged batches may take on the device (large image batches get a shorter ring)."""


def start_process(threads: int, device: torch.device, world_size: int, matmul_precision: str = "highest",
                  programs: int = 1) -> torch.device:
    """What every timing process sets before it builds anything: its threads, the float32 matmul precision
    of the job on a GPU (TF32 under "high"), a recompile limit that fails loudly (a hit limit silently runs
    the rest eagerly), the process group of its ranks, and its own GPU. Returns the device with its index.

    ``programs``: how many candidates compile in this process. They share the model's code objects, and dynamo's
    limits count entries per code object (``recompile_limit``, 8) and in all: each candidate gets the budget it
    would have alone (twelve compiled verdict neighbours hit 8 on the ninth)."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(threads)
    if device.type == "cuda":  # torch >= 2.13 also sets oneDNN's CPU matmuls from it ("medium": bf16): GPU only
        torch.set_float32_matmul_precision(matmul_precision)
    config = dynamo_config()
    config.fail_on_recompile_limit_hit = True
    if programs > 1:
        config.recompile_limit = config.recompile_limit * programs
        config.accumulated_recompile_limit = config.accumulated_recompile_limit * programs
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


def align(world_size: int) -> None:
    """Every rank waits here for the others: work one rank did alone (rank 0 counts FLOPs, saves compile
    artifacts) must not land in the others' clocks (their next collective would wait for it)."""
    import torch.distributed as dist

    if world_size > 1:
        dist.barrier()


def period(spec: TrialSpec) -> int:
    """Steps after which the data's shapes repeat and an optimizer step ends."""
    return math.lcm(len(spec.workload.seq_len), spec.workload.grad_accum_steps)


def stage(data: Callable[[int], tuple[Any, Any]], steps: int, device: torch.device) -> list[tuple[Any, Any]]:
    """The batches of the first :data:`STAGED_STEPS` steps (whole multiples of ``steps``, the period), made now
    and moved to ``device``, fewer when they would take more than :data:`STAGED_BYTES`.

    Made in the timed loop, a synthetic batch costs CPU time to generate and a copy from pageable memory,
    which the CUDA runtime does only after the stream's queued kernels ran: every step would then pay its
    launch time serially, which a real job (pinned memory, a prefetching loader) does not."""
    from autocompile.workload.data import map_tensors

    def made(i: int) -> tuple[Any, Any]:
        return map_tensors(data(i), lambda t: t.to(device))

    batches = [made(i) for i in range(steps)]
    size = sum(t.numel() * t.element_size() for b in batches for t in tensors(b))
    periods = max(1, min(-(-STAGED_STEPS // steps), STAGED_BYTES // max(1, size)))
    batches += [made(i) for i in range(steps, periods * steps)]
    return batches


def tensors(value: Any) -> list[torch.Tensor]:
    from autocompile.workload.data import map_tensors

    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return found


@dataclass
class Built:
    """A configuration applied to its own model, with its data and the losses it has produced."""

    config: TrialConfig
    model: torch.nn.Module
    step: TrainStep
    data: Callable[[int], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    facts: DataFacts
    losses: list[torch.Tensor] = field(default_factory=list)
    steps_done: int = 0
    """Steps run so far: step ``i`` trains on batch ``i``, whatever ran in this process before."""
    warm_s: list[float] = field(default_factory=list)
    """Wall seconds of each warm-up step."""
    program: Program = field(default_factory=dict)  # type: ignore[assignment]
    """What :func:`autocompile.trial.program.graphs.verify` found after the warm-up: coverage, fingerprint (empty
    until :func:`warm_up` has run)."""
    staged: list[tuple[Any, Any]] = field(default_factory=list)
    """Batches made before the warm-up, on the device (:func:`stage`); empty: ``data`` is called each step."""

    def batch(self, i: int) -> tuple[Any, Any]:
        """The batch of step ``i``: the same for every candidate, whatever ran before."""
        return self.staged[i % len(self.staged)] if self.staged else self.data(i)

    def run(self, n: int, sync: Callable[[], None] | None = None) -> int:
        """Run ``n`` steps on the next batches; returns the items (tokens, samples) they processed."""
        from autocompile.workload.data import count_items

        items = 0
        for _ in range(n):
            inputs, targets = self.batch(self.steps_done)
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
    facts = DataFacts(**model_facts(model), batch_size=workload.batch_size, seq_len=list(workload.seq_len),
                      seed=workload.seed, rank=rank, world_size=world_size, device=device)
    if spec.model.vocab_size:
        facts["vocab_size"] = spec.model.vocab_size
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
    every = period(spec)
    return -(-wanted // every) * every


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
