"""A user's own training job, compiled the way autocompile measured best.

Its own model (a small convolutional classifier over a stack of same-class blocks), optimizer (AdamW
with two parameter groups), LR schedule (linear warm-up then cosine), gradient clipping and gradient
accumulation: ``autocompile.apply`` takes them as they are, so the script runs exactly the step a
study measured with the same parts. Knobs come from a study's ``best_config.yaml`` when given::

    python examples/train_own.py --best-config runs/<study>/best_config.yaml
    python examples/train_own.py --knobs compile.scope=regional compile.optimizer=true   # or by hand

The same job as a study (``workload.*`` are these parts as Hydra ``_target_``s)::

    python -m autocompile +model=custom model._target_=examples.train_own.make_model \\
        workload.data._target_=examples.train_own.batches \\
        workload.optimizer._target_=examples.train_own.make_optimizer \\
        workload.lr_schedule._target_=examples.train_own.make_schedule \\
        workload.grad_clip_norm=1.0 workload.grad_accum_steps=2
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import nn

import autocompile
from autocompile import Env, TrialConfig

log = logging.getLogger("train_own")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.norm(self.conv(x)))


class SmallNet(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def make_model(width: int = 16, depth: int = 3, classes: int = 10) -> nn.Module:
    return SmallNet(width, depth, classes)


def batches(step: int, batch_size: int = 8, seed: int = 0, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Step -> (images, labels): the class shifts the pixels, so the net can learn it."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    labels = torch.randint(0, 4, (batch_size,), generator=gen)
    images = torch.randn(batch_size, 3, 16, 16, generator=gen) + labels.view(-1, 1, 1, 1).float()
    return images.to(device), labels.to(device)


def make_optimizer(params: Any, lr: float = 3e-3, weight_decay: float = 0.05, **impl: Any) -> torch.optim.Optimizer:
    """AdamW without weight decay on biases and norms (a common real-job detail); ``impl`` is what the
    ``optim.impl`` knob passes (foreach / fused)."""
    params = list(params)
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, **impl)


def make_schedule(optimizer: torch.optim.Optimizer, warmup: int = 2, total: int = 50) -> Any:
    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def knobs_from(args: argparse.Namespace) -> dict[str, Any]:
    if args.best_config:
        with open(args.best_config) as f:
            return dict(yaml.safe_load(f)["knobs"])
    knobs: dict[str, Any] = {}
    for item in args.knobs:
        key, _, value = item.partition("=")
        knobs[key] = yaml.safe_load(value)
    return knobs


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--best-config", help="a study's best_config.yaml")
    parser.add_argument("--knobs", nargs="*", default=["compile.scope=regional", "compile.optimizer=true"])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps")
    parser.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(0)
    model = make_model()
    config = TrialConfig.from_flat(knobs_from(args), Env.detect(args.device, 1, False), strict=False)
    step = autocompile.apply(
        model, functools.partial(make_optimizer, lr=3e-3), F.cross_entropy, config, device=args.device,
        lr_schedule=functools.partial(make_schedule, total=args.steps), grad_clip_norm=1.0,
        grad_accum_steps=args.accum)
    losses = []
    for i in range(args.steps * args.accum):
        losses.append(float(step(*batches(i, device=args.device))))
    first, last = sum(losses[: args.accum * 2]) / (args.accum * 2), sum(losses[-args.accum * 2:]) / (args.accum * 2)
    lr = float(step.optimizer.param_groups[0]["lr"])
    log.info("compiled: %s", ", ".join(step.compiled) or "nothing")
    log.info("loss %.4f -> %.4f over %d optimizer steps; lr now %.2e; scheduler stepped %d times",
             first, last, args.steps, lr, step.scheduler.last_epoch)
    return last


if __name__ == "__main__":
    main()
