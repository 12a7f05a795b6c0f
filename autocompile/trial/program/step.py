"""Turn a model, optimizer, loss, schedule, clipping and accumulation into the training step a
:class:`TrialConfig` describes.

This is the public entry point users call from their own training script, and the one the
worker calls with the workload's parts, so a measured configuration and an applied one are the
same code::

    step = autocompile.apply(model, functools.partial(torch.optim.AdamW, lr=3e-4), cross_entropy, config,
                             device="cuda", lr_schedule=functools.partial(CosineAnnealingLR, T_max=1000),
                             grad_clip_norm=1.0, grad_accum_steps=4)
    for inputs, targets in loader:      # one micro-batch per call; every 4th call steps the optimizer
        loss = step(inputs, targets)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autocompile.config.choices import MEMORY_BUDGETS, KnobValue, compiles
from autocompile.config.knobs import CompileKnobs, TrialConfig
from autocompile.config.torch_private import mode_options
from autocompile.trial.program.apply_parts import (
    CompileKwargs,
    Compilers,
    Context,
    DdpKwargs,
    DynamoSettings,
    apply_ac,
    apply_autocast,
    apply_compiled_update,
    apply_ddp,
    apply_fsdp,
    apply_optim,
    apply_optimize_ddp,
    clipping,
    compile_targets,
    compiled_autograd,
    compiles_ddp,
    grad_scaler,
    inner_autocast,
    outer_autocast,
    place_and_compile,
    step_compiled,
)
from autocompile.trial.program.graphs import CompileLog
from autocompile.workload.losses import lm_loss
from autocompile.workload.optim import OptimizerLike, ScheduleLike

LossFn = Callable[[Any, Any], torch.Tensor]
__all__ = ["TrainStep", "apply", "lm_loss"]


@dataclass
class TrainStep:
    """One micro-step: ``step(inputs, targets)`` returns the detached loss of that micro-batch; every
    ``grad_accum_steps``-th call also clips, steps the optimizer and the schedule, and zeroes gradients."""

    fn: Callable[[Any, Any], torch.Tensor]
    model: nn.Module
    """What the forward pass runs through (DDP and/or compiled wrappers included)."""
    compiled: list[str] = field(default_factory=list)
    """What was handed to ``torch.compile`` (module paths, ``train_step``, ``optimizer.step``...)."""
    units: list[tuple[str, nn.Module]] = field(default_factory=list)
    """The compiled units that hold the model's weights: each must run inside a compiled graph."""
    roles: set[str] = field(default_factory=set)
    """Other compiled parts (``optimizer``, ``autograd``) that must each produce a graph."""
    log: CompileLog = field(default_factory=CompileLog)
    """Every graph the backends received."""
    eager_parts: dict[str, KnobValue] = field(default_factory=dict)
    """What shapes the code that runs outside graphs, for the program's fingerprint."""
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer the step updates (built here when ``apply`` got a factory): save it with checkpoints."""
    scheduler: Any = None
    """The LR scheduler, stepped once per optimizer step (None: constant LR)."""
    sharded: list[str] = field(default_factory=list)
    """Modules ``fully_shard`` wrapped (``model`` for the root): their all-gather, reshard and reduce-scatter hooks
    run eagerly around the compiled code (FSDP2 wraps them in ``dynamo.disable``)."""
    settings: DynamoSettings = field(default_factory=DynamoSettings)
    """Process-global dynamo settings this step was built under (``optimize_ddp``): a process that runs
    several steps side by side patches them around each one's calls."""

    def __call__(self, inputs: Any, targets: Any) -> torch.Tensor:
        return self.fn(inputs, targets)


def compile_kwargs(knobs: CompileKnobs) -> CompileKwargs:
    """``torch.compile`` arguments; mode and options are merged since both together raise."""
    kwargs: CompileKwargs = {"backend": knobs.backend, "fullgraph": knobs.fullgraph, "dynamic": knobs.dynamic}
    if knobs.backend != "inductor":
        return kwargs
    extra = {k: v for k, v in asdict(knobs.options).items() if v is not None}
    if extra:
        kwargs["options"] = {**mode_options(knobs.mode), **extra}
    elif knobs.mode != "default":
        kwargs["mode"] = knobs.mode
    return kwargs


def uses_cuda_graphs(kwargs: CompileKwargs) -> bool:
    """Whether inductor will record CUDA graphs (``reduce-overhead``, ``max-autotune``...)."""
    if kwargs["backend"] != "inductor":
        return False
    options = kwargs.get("options") or mode_options(kwargs.get("mode", "default"))
    return bool(options.get("triton.cudagraphs", False))


def marks_cuda_graph_steps(kwargs: CompileKwargs, scope: str, device: torch.device) -> bool:
    """Whether each call starts a new CUDA-graph generation: something is compiled for CUDA in a mode whose
    graph trees reuse output memory on the next replay."""
    return device.type == "cuda" and compiles(scope) and uses_cuda_graphs(kwargs)


def accumulation_error(mode: str, grad_accum_steps: int) -> str:
    """Why a CUDA-graph mode cannot accumulate gradients, and what to do instead."""
    return (f"compile.mode={mode!r} records CUDA graphs, which cannot accumulate gradients over "
            f"grad_accum_steps={grad_accum_steps} micro-batches: each micro-batch's replay overwrites the gradients "
            "AccumulateGrad kept from the one before (pytorch#169545). Set grad_accum_steps=1 (with a batch that "
            "many times larger), or choose a mode without CUDA graphs (default, max-autotune-no-cudagraphs).")


def apply(
    model: nn.Module,
    optimizer: OptimizerLike,
    loss_fn: LossFn,
    config: TrialConfig,
    *,
    device: str | torch.device = "cpu",
    distributed: bool | None = None,
    ddp_kwargs: DdpKwargs | None = None,
    lr_schedule: ScheduleLike = None,
    grad_clip_norm: float = 0.0,
    grad_accum_steps: int = 1,
) -> TrainStep:
    """Build the training step ``config`` means, in the order it says.

    ``optimizer``: an optimizer over the model's parameters, or a factory taking the parameters
    (``functools.partial(torch.optim.AdamW, lr=3e-4)``: needed for ``optim.impl``, it is then built
    after the model is on its device). ``lr_schedule``: None, an LR scheduler, or a factory taking the
    optimizer. ``grad_clip_norm`` > 0 clips before each optimizer step; ``grad_accum_steps`` micro-batches
    (calls) make one optimizer step, DDP syncing gradients on the last only (not in a CUDA-graph mode on CUDA:
    ValueError). Inputs may be a tensor, a tuple (positional arguments) or a dict (keyword arguments).

    Mutates ``model`` (compiled, checkpointed or autocast ``forward`` of its units; ``fully_shard`` under
    ``parallel.strategy=fsdp2``), the optimizer (a compiled ``step``, a tensor LR) and
    ``torch._dynamo.config.optimize_ddp``. ``.to(device)`` keeps
    parameter identity, so an optimizer built before still holds the model's parameters.
    ``distributed`` defaults to "a process group of more than one rank is initialised".
    """
    if grad_accum_steps < 1 or grad_clip_norm < 0:
        raise ValueError(f"grad_accum_steps={grad_accum_steps} must be >= 1 and grad_clip_norm={grad_clip_norm} >= 0")
    device = torch.device(device)
    distributed = _process_group_of_many() if distributed is None else distributed
    knobs, amp = config.compile, config.amp
    log = CompileLog()
    compilers = Compilers(log, compile_kwargs(knobs), MEMORY_BUDGETS.get(config.ac.policy))
    cuda_graphs = marks_cuda_graph_steps(compilers.kwargs, knobs.scope, device)
    if cuda_graphs and grad_accum_steps > 1:
        raise ValueError(accumulation_error(knobs.mode, grad_accum_steps))

    sharded = distributed and config.parallel.strategy == "fsdp2"
    if sharded and isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("parallel.strategy=fsdp2 replaces the model's parameters with sharded ones, so an optimizer "
                         "built before holds parameters that no longer train: pass a factory such as "
                         f"functools.partial(torch.optim.{type(optimizer).__name__}, lr=...)")
    apply_ac(model, config.ac)
    targets = compile_targets(model, knobs)
    apply_autocast(targets, amp, knobs.scope, device)
    settings = apply_optimize_ddp(config.ddp, distributed and not sharded)
    of_ddp = compiles_ddp(config.ddp, knobs.scope, distributed and not sharded)
    compile_model = compilers("model")
    if sharded:
        compiled, sharded_units = apply_fsdp(model, targets, config.fsdp, device, compile_model, log)
        runner, ddp = model, None
    else:
        sharded_units = []
        compiled = place_and_compile(model, [] if of_ddp else targets, config.placement, device, compile_model, log)
        runner, ddp = apply_ddp(model, compile_model, of_ddp, ddp_kwargs) if distributed else (model, None)
        compiled += ["DistributedDataParallel(model)"] if of_ddp else []

    optimizer, scheduler = apply_optim(optimizer, model, config.optim, lr_schedule, step_compiled(knobs), device)
    scaler = grad_scaler(amp, device)
    clip, names = apply_compiled_update(optimizer, clipping(optimizer, grad_clip_norm), knobs, config.optim, compilers)
    autograd, autograd_names = compiled_autograd(knobs, compilers)
    compiled += names + autograd_names

    micro = Micro(runner, loss_fn, scaled_backward(scaler, grad_accum_steps),
                  optimizer_update(optimizer, scaler, clip, unscale=grad_clip_norm > 0), grad_accum_steps, ddp,
                  scheduler, cuda_graphs, model if sharded else None)
    outer = outer_autocast(amp, knobs.scope, device)
    if knobs.scope == "train_step":
        fn = train_step(micro, outer, inner_autocast(amp, knobs.scope), device.type, compilers("train_step"))
        compiled, checked = [*compiled, "train_step"], [("train_step", model)]
    else:
        fn = eager_step(micro, outer, autograd)
        checked = [("DistributedDataParallel(model)", model)] if of_ddp else list(targets)
    return TrainStep(fn=fn, model=runner, compiled=compiled, units=checked, roles=_roles(compiled), log=log,
                     eager_parts={"amp.dtype": amp.dtype, "ac.policy": config.ac.policy, "distributed": distributed,
                                  "optim.impl": config.optim.impl, "clip": grad_clip_norm, "accum": grad_accum_steps,
                                  "schedule": type(scheduler).__name__ if scheduler is not None else None,
                                  **_sharding(config, sharded)},
                     optimizer=optimizer, scheduler=scheduler, settings=settings, sharded=sharded_units)


@dataclass
class Micro:
    """What every call of the step shares: the forward, the backward and update, and which call of each
    ``accum`` steps the optimizer."""

    runner: nn.Module
    loss_fn: LossFn
    backward: Callable[[torch.Tensor], None]
    update: Callable[[], None]
    accum: int
    ddp: nn.parallel.DistributedDataParallel | None
    scheduler: Any
    cuda_graphs: bool
    """CUDA graph trees reuse output memory on the next replay: each step starts a new generation."""
    sharded: nn.Module | None = None
    """The FSDP2 root (``fully_shard``-ed model), or None."""
    calls: Iterator[int] = field(default_factory=itertools.count)

    def begin(self) -> bool:
        """Start a call; whether it is the last micro-batch of an optimizer step."""
        last = next(self.calls) % self.accum == self.accum - 1
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return last

    def sync(self, last: bool) -> AbstractContextManager[Any]:
        """Micro-steps that do not step the optimizer keep their gradients local (DDP's ``no_sync``; FSDP2's
        ``set_requires_gradient_sync``, which keeps them unsharded and unreduced until the last)."""
        if self.sharded is not None and self.accum > 1:
            self.sharded.set_requires_gradient_sync(last)  # type: ignore[operator]
        return self.ddp.no_sync() if self.ddp is not None and not last else nullcontext()

    def end(self, last: bool) -> None:
        """The schedule steps once per optimizer step, in eager code."""
        if last and self.scheduler is not None:
            self.scheduler.step()


def scaled_backward(scaler: torch.amp.GradScaler | None, grad_accum_steps: int) -> Callable[[torch.Tensor], None]:
    """The backward of one micro-batch: its loss divided over the accumulated ones, scaled for float16."""
    def backward(loss: torch.Tensor) -> None:
        scaled = loss / grad_accum_steps if grad_accum_steps > 1 else loss
        (scaler.scale(scaled) if scaler is not None else scaled).backward()

    return backward


def optimizer_update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                     clip: Callable[[], Any] | None, unscale: bool) -> Callable[[], None]:
    """The update after the last micro-batch: unscale (float16, when gradients are clipped here or inside the
    compiled step, so clipping sees true gradients), clip (``clip``: what is left to call here), step, zero."""
    def update() -> None:
        if unscale and scaler is not None:
            scaler.unscale_(optimizer)
        if clip is not None:
            clip()
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return update


def eager_step(micro: Micro, outer: Context, autograd: Context) -> Callable[[Any, Any], torch.Tensor]:
    """The step of the scopes that compile parts (``none``, ``module``, ``regional``): the loop in eager code,
    forward and backward under compiled autograd's context when it is on. A loss that a compiled unit returned
    (``model_loss``, ``output.loss``) is CUDA-graph memory: copied out before the next replay overwrites it."""
    def step(inputs: Any, targets: Any) -> torch.Tensor:
        last = micro.begin()
        with micro.sync(last), autograd():
            with outer():
                loss = micro.loss_fn(_call(micro.runner, inputs), targets)
            micro.backward(loss)
            if last:
                micro.update()
        micro.end(last)
        return loss.detach().clone() if micro.cuda_graphs else loss.detach()

    return step


def train_step(micro: Micro, outer: Context, inner: torch.dtype | None, device_type: str,
               compile_step: Callable[[Any], Any]) -> Callable[[Any, Any], torch.Tensor]:
    """``compile.scope=train_step``: forward, loss, backward and update in one compiled function (its graph
    breaks at ``backward``); ``inner`` the autocast dtype inside it (``amp.placement=inside``). A loss that is
    a CUDA-graph output is copied out before the next replay can overwrite it."""
    runner, loss_fn, backward, update = micro.runner, micro.loss_fn, micro.backward, micro.update

    def whole_step(inputs: Any, targets: Any, last: bool) -> torch.Tensor:
        with torch.autocast(device_type, dtype=inner) if inner is not None else nullcontext():
            loss = loss_fn(_call(runner, inputs), targets)
        backward(loss)
        if last:  # a Python bool: dynamo specialises, one graph per value
            update()
        return loss.detach()

    compiled_step = compile_step(whole_step)

    def step(inputs: Any, targets: Any) -> torch.Tensor:
        last = micro.begin()
        with micro.sync(last), outer():
            loss = compiled_step(inputs, targets, last)
        micro.end(last)
        return loss.clone() if micro.cuda_graphs else loss

    return step


def _process_group_of_many() -> bool:
    """``distributed``'s default: a process group of more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _sharding(config: TrialConfig, sharded: bool) -> dict[str, KnobValue]:
    """What FSDP2 adds to the eager part of the program (the fingerprint's): the strategy and what changes its
    communication or dtypes. Not ``fsdp.order``: the hooks run around the compiled units in either order."""
    if not sharded:
        return {}
    return {"parallel.strategy": "fsdp2", "fsdp.reshard_after_forward": config.fsdp.reshard_after_forward,
            "fsdp.mp_policy": config.fsdp.mp_policy}


def _roles(compiled: list[str]) -> set[str]:
    """The compiled parts other than the model's units, each of which must produce a graph."""
    roles = {"optimizer"} if any(c.startswith("optimizer.step") for c in compiled) else set()
    roles |= {"autograd"} if "compiled_autograd" in compiled else set()
    return roles | ({"clip"} if "clip_grad_norm_" in compiled else set())


def _call(model: Callable[..., Any], inputs: Any) -> Any:
    """A tensor is one argument, a tuple positional arguments, a dict keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)
