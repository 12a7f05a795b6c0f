"""Compose settings as the command line does, and run a job's step in-process exactly as the worker builds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.trial.program.step import TrainStep, apply
from autocompile.workload.infer import model_facts
from autocompile.workload.models import build
from autocompile.workload.parts import build_data, build_loss, optimizer_factory, schedule_factory

Compose = Callable[..., Settings]
FAST_MEASURE = ("workload.device=cpu", "workload.threads=1", "measure.warmup_steps=2", "measure.windows=2",
                "measure.window_steps=2", "measure.precision=0")


def run_job(settings: Settings, knobs: dict[str, Any], steps: int) -> tuple[TrainStep, torch.nn.Module, list[float]]:
    """``steps`` calls of the step the worker would build for ``settings`` (in this process)."""
    torch._dynamo.reset()
    w = settings.workload
    torch.manual_seed(w.seed)
    model = build(settings.model.target, settings.model.kwargs)
    facts = {**model_facts(model), **({"vocab_size": settings.model.vocab_size} if settings.model.vocab_size else {}),
             "batch_size": w.batch_size, "seq_len": list(w.seq_len), "seed": w.seed, "rank": 0, "world_size": 1,
             "device": torch.device("cpu")}
    data = build_data(w.data, facts)
    config = TrialConfig.from_flat(knobs, settings.env)
    step = apply(model, optimizer_factory(w.optimizer), build_loss(w.loss), config,
                 lr_schedule=schedule_factory(w.lr_schedule), grad_clip_norm=w.grad_clip_norm,
                 grad_accum_steps=w.grad_accum_steps)
    return step, model, [float(step(*data(i))) for i in range(steps)]


def falls(losses: list[float]) -> bool:
    half = len(losses) // 2
    return sum(losses[half:]) / (len(losses) - half) < sum(losses[:half]) / half
