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

import functools
import itertools
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autocompile.config.knobs import CompileKnobs, TrialConfig
from autocompile.trial import units
from autocompile.trial.programs import CompileLog, Recorder
from autocompile.workload.losses import lm_loss
from autocompile.workload.optim import (
    OptimizerLike,
    ScheduleLike,
    build_optimizer,
    build_schedule,
    clipper,
    use_tensor_lr,
)

LossFn = Callable[[Any, Any], torch.Tensor]
__all__ = ["TrainStep", "apply", "lm_loss"]

AMP_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZE_DDP = {"ddp_optimizer": True, "no_optimization": False, "python_reducer": "python_reducer"}


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
    eager_parts: dict[str, Any] = field(default_factory=dict)
    """What shapes the code that runs outside graphs, for the program's fingerprint."""
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer the step updates (built here when ``apply`` got a factory): save it with checkpoints."""
    scheduler: Any = None
    """The LR scheduler, stepped once per optimizer step (None: constant LR)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Process-global dynamo settings this step was built under (``optimize_ddp``): a process that runs
    several steps side by side patches them around each one's calls."""

    def __call__(self, inputs: Any, targets: Any) -> torch.Tensor:
        return self.fn(inputs, targets)


def compile_kwargs(knobs: CompileKnobs) -> dict[str, Any]:
    """``torch.compile`` arguments; mode and options are merged since both together raise."""
    kwargs: dict[str, Any] = {"backend": knobs.backend, "fullgraph": knobs.fullgraph, "dynamic": knobs.dynamic}
    if knobs.backend != "inductor":
        return kwargs
    extra = {k: v for k, v in asdict(knobs.options).items() if v is not None}
    if extra:
        from torch._inductor import list_mode_options

        kwargs["options"] = {**list_mode_options(knobs.mode), **extra}
    elif knobs.mode != "default":
        kwargs["mode"] = knobs.mode
    return kwargs


def uses_cuda_graphs(kwargs: dict[str, Any]) -> bool:
    """Whether inductor will record CUDA graphs (``reduce-overhead``, ``max-autotune``...)."""
    if kwargs["backend"] != "inductor":
        return False
    from torch._inductor import list_mode_options

    options = kwargs.get("options") or list_mode_options(kwargs.get("mode", "default"))
    return bool(options.get("triton.cudagraphs", False))


def apply(
    model: nn.Module,
    optimizer: OptimizerLike,
    loss_fn: LossFn,
    config: TrialConfig,
    *,
    device: str | torch.device = "cpu",
    distributed: bool | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
    lr_schedule: ScheduleLike = None,
    grad_clip_norm: float = 0.0,
    grad_accum_steps: int = 1,
) -> TrainStep:
    """Build the training step ``config`` means, in the order it says.

    ``optimizer``: an optimizer over the model's parameters, or a factory taking the parameters
    (``functools.partial(torch.optim.AdamW, lr=3e-4)``: needed for ``optim.impl``, it is then built
    after the model is on its device). ``lr_schedule``: None, an LR scheduler, or a factory taking the
    optimizer. ``grad_clip_norm`` > 0 clips before each optimizer step; ``grad_accum_steps`` micro-batches
    (calls) make one optimizer step, DDP syncing gradients on the last only. Inputs may be a tensor, a
    tuple (positional arguments) or a dict (keyword arguments).

    Mutates ``model`` (compiled, checkpointed or autocast ``forward`` of its units), the optimizer
    (a compiled ``step``, a tensor LR) and ``torch._dynamo.config.optimize_ddp``. ``.to(device)`` keeps
    parameter identity, so an optimizer built before still holds the model's parameters.
    ``distributed`` defaults to "a process group of more than one rank is initialised".
    """
    if grad_accum_steps < 1 or grad_clip_norm < 0:
        raise ValueError(f"grad_accum_steps={grad_accum_steps} must be >= 1 and grad_clip_norm={grad_clip_norm} >= 0")
    device = torch.device(device)
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    knobs = config.compile
    scope = knobs.scope
    kwargs = compile_kwargs(knobs)
    log = CompileLog()

    def compiler(role: str, **overrides: Any) -> Callable[[Any], Any]:
        """``torch.compile`` with this role's recorder: one backend object per role, so same-class
        units share their graph (a new backend object per unit would recompile each one)."""
        merged = {**kwargs, **overrides}
        backend = Recorder(log, role, merged["backend"], merged.get("mode"), merged.get("options"), merged["dynamic"])
        return functools.partial(torch.compile, backend=backend, fullgraph=merged["fullgraph"],
                                 dynamic=merged["dynamic"])

    dtype = AMP_DTYPES[config.amp.dtype]
    inside = dtype is not None and scope != "none" and config.amp.placement == "inside"
    compiled: list[str] = []

    if config.ac.policy == "block":
        for _, block in units.blocks(model):
            if any(True for _ in block.children()):  # a leaf (a head) has no activations worth recomputing
                _wrap_forward(block, _checkpointed)

    targets = _compile_units(model, knobs) if scope in ("module", "regional") else []
    if inside and scope != "train_step":
        for _, unit in targets:
            _wrap_forward(unit, lambda fwd: _autocast(fwd, device.type, dtype))

    settings: dict[str, Any] = {}
    if distributed:
        # DDP reads the mode in __init__ (python reducer) and dynamo when it compiles DDP graphs.
        settings["optimize_ddp"] = torch._dynamo.config.optimize_ddp = OPTIMIZE_DDP[config.ddp.optimize]
    compile_of_ddp = distributed and scope == "module" and config.ddp.wrap_order == "compile_of_ddp"
    compile_model = compiler("model")

    def compile_units() -> None:
        # Through ``forward``, not ``module.compile()``: that compiles ``_call_impl``, and when the
        # forward is defined inside torch (nn.Sequential, nn.TransformerEncoderLayer, nn.Linear)
        # dynamo finds no frame of its own to trace and the unit silently runs eager. An instance
        # attribute keeps the state dict free of ``_orig_mod.``.
        for name, unit in targets:
            _compile_forward(unit, compile_model, functools.partial(log.counted, name))
            compiled.append(name)

    if targets and not compile_of_ddp and config.placement.order == "compile_then_to":
        compile_units()
        model.to(device)
    else:
        model.to(device)
        if not compile_of_ddp:
            compile_units()
    runner: nn.Module = model
    ddp: nn.parallel.DistributedDataParallel | None = None
    checked = list(targets)
    if distributed:
        runner = ddp = nn.parallel.DistributedDataParallel(model, **(ddp_kwargs or {}))
        if compile_of_ddp:
            runner = compile_model(runner)
            compiled.append("DistributedDataParallel(model)")
            checked = [("DistributedDataParallel(model)", model)]

    # Built once the parameters are on their device (fused kernels check it), with the knob's implementation.
    optimizer = build_optimizer(optimizer, model.parameters(), config.optim.impl)
    step_compiled = scope == "train_step" or (knobs.optimizer and scope in ("module", "regional"))
    if lr_schedule is not None and step_compiled and config.optim.tensor_lr:
        use_tensor_lr(optimizer, device)
    scheduler = build_schedule(lr_schedule, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clip = clipper(params, grad_clip_norm) if grad_clip_norm > 0 else None
    clip_compiled = clip is not None and scope in ("module", "regional") and config.optim.clip == "compiled"

    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    if knobs.optimizer and scope in ("module", "regional"):
        # The compiled-optimizer recipe: the backend alone, no mode or fullgraph (it breaks by design).
        compile_optimizer = compiler("optimizer", mode=None, options=None, fullgraph=False, dynamic=None)
        # Clipping inside the compiled step: GradScaler unscales before calling it, as it must.
        optimizer.step = compile_optimizer(  # type: ignore[method-assign]
            _clip_then(clip, optimizer.step) if clip_compiled else optimizer.step)
        compiled.append("optimizer.step+clip_grad_norm_" if clip_compiled else "optimizer.step")
        clip = None if clip_compiled else clip  # it runs inside the step now
    elif clip_compiled:
        clip = compiler("clip", mode=None, options=None, fullgraph=False, dynamic=None)(clip)
        compiled.append("clip_grad_norm_")
    # Regional "inside" keeps an outer autocast for the uncompiled rest (embeddings, head), so
    # both placements compute in the same precision and differ only in where the context sits.
    outer = functools.partial(torch.autocast, device.type, dtype=dtype) if dtype is not None and not (
        inside and scope != "regional") else nullcontext
    compiled_autograd: Callable[[], AbstractContextManager[Any]] = nullcontext
    if knobs.compiled_autograd and scope in ("module", "regional"):
        backward = compiler("autograd", fullgraph=False)
        compiled_autograd = functools.partial(torch._dynamo.compiled_autograd._enable, backward())
        compiled.append("compiled_autograd")

    def backward(loss: torch.Tensor) -> None:
        scaled = loss / grad_accum_steps if grad_accum_steps > 1 else loss
        (scaler.scale(scaled) if scaler is not None else scaled).backward()

    def update(clip_here: Callable[[], Any] | None) -> None:
        if clip_here is not None or "optimizer.step+clip_grad_norm_" in compiled:
            if scaler is not None:
                scaler.unscale_(optimizer)  # clipping sees true gradients
            if clip_here is not None:
                clip_here()
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    # CUDA graph trees reuse output memory on the next replay: each step starts a new generation,
    # and a loss that is a graph output (train_step) is copied out before it can be overwritten.
    cuda_graphs = device.type == "cuda" and scope != "none" and uses_cuda_graphs(kwargs)
    mark_step = torch.compiler.cudagraph_mark_step_begin if cuda_graphs else lambda: None
    micro = itertools.count()

    def sync_context(last: bool) -> AbstractContextManager[Any]:
        # Micro-steps that do not step the optimizer keep their gradients local (DDP's no_sync).
        return ddp.no_sync() if ddp is not None and not last else nullcontext()

    if scope == "train_step":
        def whole_step(inputs: Any, targets: Any, last: bool) -> torch.Tensor:
            with torch.autocast(device.type, dtype=dtype) if inside else nullcontext():
                loss = loss_fn(_call(runner, inputs), targets)
            backward(loss)
            if last:  # a Python bool: dynamo specialises, one graph per value
                update(clip)
            return loss.detach()

        compiled_step = compiler("train_step")(whole_step)
        compiled.append("train_step")
        checked = [("train_step", model)]

        def step(inputs: Any, targets: Any) -> torch.Tensor:
            last = next(micro) % grad_accum_steps == grad_accum_steps - 1
            mark_step()
            with sync_context(last), outer():
                loss = compiled_step(inputs, targets, last)
            if last and scheduler is not None:
                scheduler.step()
            return loss.clone() if cuda_graphs else loss
    else:
        def step(inputs: Any, targets: Any) -> torch.Tensor:
            last = next(micro) % grad_accum_steps == grad_accum_steps - 1
            mark_step()
            with sync_context(last), compiled_autograd():
                with outer():
                    loss = loss_fn(_call(runner, inputs), targets)
                backward(loss)
                if last:
                    update(clip)
            if last and scheduler is not None:
                scheduler.step()
            return loss.detach()

    roles = {"optimizer"} if any(c.startswith("optimizer.step") for c in compiled) else set()
    roles |= {"autograd"} if "compiled_autograd" in compiled else set()
    roles |= {"clip"} if "clip_grad_norm_" in compiled else set()
    return TrainStep(fn=step, model=runner, compiled=compiled, units=checked, roles=roles, log=log,
                     eager_parts={"amp.dtype": config.amp.dtype, "ac.policy": config.ac.policy,
                                  "distributed": distributed, "optim.impl": config.optim.impl,
                                  "clip": grad_clip_norm, "accum": grad_accum_steps,
                                  "schedule": type(scheduler).__name__ if scheduler is not None else None},
                     optimizer=optimizer, scheduler=scheduler, settings=settings)


def _call(model: Callable[..., Any], inputs: Any) -> Any:
    """A tensor is one argument, a tuple positional arguments, a dict keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _clip_then(clip: Callable[[], Any], step: Callable[..., Any]) -> Callable[..., Any]:
    def clip_and_step(*args: Any, **kwargs: Any) -> Any:
        clip()
        return step(*args, **kwargs)

    return clip_and_step


def _compile_units(model: nn.Module, knobs: CompileKnobs) -> list[tuple[str, nn.Module]]:
    """The modules whose ``forward`` is compiled in place."""
    if knobs.scope == "module":
        return [("model", model)]
    if knobs.granularity == "nested":
        # One marked function bound to every block, as the decorator on the class would be (one
        # region traced once, reused by each block), without changing the class for other users.
        for _, block in units.blocks(model):
            region = torch.compiler.nested_compile_region(type(block).forward)
            block.forward = types.MethodType(region, block)  # type: ignore[method-assign]
        return [("model", model)]
    found = units.blocks(model)
    if knobs.granularity == "sublayer":
        # A block without parts of its own (a Linear head in a ModuleList) is its own unit.
        found = [(f"{name}.{sub}", m) if sub else (name, m) for name, block in found
                 for sub, m in (units.sublayers(block) or [("", block)])]
    # Accelerate's compile_regions: the rest of the model (embeddings, final norm, head) compiled too.
    return found + (units.rest(model) if knobs.rest == "compiled" else [])


def _compile_forward(unit: nn.Module, compile_fn: Callable[[Any], Any],
                     count: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Compile the function behind ``unit.forward`` and bind it back. Not the bound method itself:
    torch wraps every bound method in one shared helper frame, so units of different classes would
    recompile that one frame until the recompile limit. The class's function is one code object per
    class, shared by its instances (one graph for all blocks); a wrapper of ours is compiled as is."""
    own = unit.__dict__.get("forward")
    if own is not None and not isinstance(own, types.MethodType):
        unit.forward = count(compile_fn(own))  # type: ignore[method-assign]
    else:
        function = own.__func__ if own is not None else type(unit).forward
        unit.forward = count(types.MethodType(compile_fn(function), unit))  # type: ignore[method-assign]


def _wrap_forward(module: nn.Module, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    module.forward = wrapper(module.forward)  # type: ignore[method-assign]


def _checkpointed(fwd: Callable[..., Any]) -> Callable[..., Any]:
    # A plain function, not functools.partial(checkpoint, ...): dynamo skipped the frame of a block
    # whose forward was such a partial, so regional compile silently compiled nothing (torch 2.13).
    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(fwd, *args, use_reentrant=False, **kwargs)

    return forward


def _autocast(fwd: Callable[..., Any], device_type: str, dtype: torch.dtype | None) -> Callable[..., Any]:
    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return fwd(*args, **kwargs)

    return forward
