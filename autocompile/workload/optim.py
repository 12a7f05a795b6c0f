"""The optimizer side of a training step: implementation, tensor learning rate, schedule, clipping.

Checked on torch 2.13 (CPU, ``aot_eager``), ``torch.compile(optimizer.step)`` under an LR scheduler:

- A Python-float LR is a constant to dynamo. The for-loop and fused AdamW recompile once or twice,
  then the float is traced as a symbol (``specialize_float=False``); foreach (CUDA's default)
  recompiles at every step until ``recompile_limit``. A 0-dim tensor LR never recompiles.
- Schedulers keep a tensor LR a tensor (``fill_``) and clone it for ``initial_lr``.
- foreach with a tensor LR raises "lr as a Tensor is not supported for capturable=False and
  foreach=True"; ``capturable=True`` is what dynamo sets itself on CUDA, and on CPU it only runs
  compiled (eager asserts CUDA-like devices), so it is set only for a compiled step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from autocompile.workload.parts import IMPL_KWARGS

OptimizerLike = torch.optim.Optimizer | Callable[..., torch.optim.Optimizer]
ScheduleLike = Any  # an LRScheduler, or a callable building one from the optimizer


def build_optimizer(optimizer: OptimizerLike, params: Iterable[torch.nn.Parameter], impl: str) -> torch.optim.Optimizer:
    """The optimizer, built from a factory (``functools.partial(torch.optim.AdamW, lr=...)``) with
    ``impl``'s arguments: an implementation is chosen when the optimizer is built. An instance that has
    not stepped yet is rebuilt the same way (same class, groups and hyperparameters)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer(params, **IMPL_KWARGS[impl])
    if impl == "default":
        return optimizer
    if optimizer.state:
        raise ValueError(f"optim.impl={impl} needs an optimizer that has not stepped yet (its state would be lost): "
                         f"pass it before training, or a factory such as functools.partial("
                         f"{type(optimizer).__module__}.{type(optimizer).__name__}, lr=...)")
    groups = [{**group, **{k: None for k in ("foreach", "fused") if k in group}, **IMPL_KWARGS[impl]}
              for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer)).parameters  # defaults also hold keys the constructor sets itself
    # impl's arguments to the constructor too: it checks them there (and fused sets its AMP-scaling support)
    kwargs = {**{k: v for k, v in optimizer.defaults.items() if k in accepted}, **IMPL_KWARGS[impl]}
    return type(optimizer)(groups, **kwargs)


def set_impl(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """``impl`` on ``optimizer`` itself, for a script that holds it (its scheduler and GradScaler do too): the
    optimizer is rebuilt as :func:`build_optimizer` does, so its constructor checks the implementation, and
    the rebuilt groups' choice and AMP-scaling support are copied onto it."""
    if impl == "default":
        return optimizer
    built = build_optimizer(optimizer, [p for g in optimizer.param_groups for p in g["params"]], impl)
    for group, new in zip(optimizer.param_groups, built.param_groups, strict=True):
        group.update({k: new[k] for k in ("foreach", "fused") if k in new})
    optimizer.defaults.update({k: built.defaults[k] for k in ("foreach", "fused") if k in built.defaults})
    optimizer._step_supports_amp_scaling = getattr(built, "_step_supports_amp_scaling", False)  # fused unscales itself
    return optimizer


def use_tensor_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """PyTorch's "compiled optimizer with an LR scheduler" recipe: each group's LR a 0-dim tensor.

    Done after the optimizer is built, not with ``lr=torch.tensor(...)``: Adam's constructor rejects a
    tensor LR with foreach unless capturable, and capturable is only valid where the step is compiled."""
    for group in optimizer.param_groups:
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]))
        if group.get("foreach") and device.type == "cpu" and "capturable" in group:
            group["capturable"] = True


def build_schedule(schedule: ScheduleLike, optimizer: torch.optim.Optimizer) -> Any:
    """The scheduler, or built from a factory with the optimizer (after ``use_tensor_lr``: it then
    records the tensor LR, cloned, as the initial one)."""
    if schedule is None or hasattr(schedule, "step"):
        return schedule
    return schedule(optimizer)


def clipper(params: list[torch.nn.Parameter], max_norm: float) -> Callable[[], torch.Tensor]:
    def clip() -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    return clip
