"""Turn a model, optimizer and loss into the training step a :class:`TrialConfig` describes.

This is the public entry point users call from their own training script, and the one the
worker calls, so a measured configuration and an applied one are the same code::

    step = autocompile.apply(model, optimizer, lm_loss, config, device="cuda")
    for inputs, targets in loader:
        loss = step(inputs, targets)
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autocompile.knobs import CompileKnobs, TrialConfig
from autocompile.models import find_blocks, sublayers

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]

AMP_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZE_DDP = {"ddp_optimizer": True, "no_optimization": False, "python_reducer": "python_reducer"}


def lm_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on logits or on a model output with ``.logits``."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass
class TrainStep:
    """One optimizer step: ``step(inputs, targets)`` returns the detached loss."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    model: nn.Module
    """What the forward pass runs through (DDP and/or compiled wrappers included)."""
    compiled: list[str] = field(default_factory=list)
    """What was handed to ``torch.compile`` (module paths, ``train_step``, ``optimizer.step``...)."""

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
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
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    config: TrialConfig,
    *,
    device: str | torch.device = "cpu",
    distributed: bool | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
) -> TrainStep:
    """Build the training step ``config`` means, in the order it says.

    Mutates ``model`` (in-place compile, checkpoint/autocast wrappers on block forwards),
    ``optimizer`` (a compiled ``step``) and ``torch._dynamo.config.optimize_ddp``. The optimizer's
    parameters must be the model's: ``.to(device)`` keeps parameter identity. ``distributed``
    defaults to "a process group of more than one rank is initialised".
    """
    device = torch.device(device)
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    knobs = config.compile
    scope = knobs.scope
    kwargs = compile_kwargs(knobs)
    dtype = AMP_DTYPES[config.amp.dtype]
    inside = dtype is not None and scope != "none" and config.amp.placement == "inside"
    compiled: list[str] = []

    if config.ac.policy == "block":
        for block in find_blocks(model)[1]:
            _wrap_forward(block, _checkpointed)

    units = _compile_units(model, knobs) if scope in ("module", "regional") else []
    if inside and scope != "train_step":
        for _, unit in units:
            _wrap_forward(unit, lambda fwd: _autocast(fwd, device.type, dtype))

    if distributed:
        # DDP reads the mode in __init__ (python reducer) and dynamo when it compiles DDP graphs.
        torch._dynamo.config.optimize_ddp = OPTIMIZE_DDP[config.ddp.optimize]
    compile_of_ddp = distributed and scope == "module" and config.ddp.wrap_order == "compile_of_ddp"

    def compile_units() -> None:
        for name, unit in units:
            unit.compile(**kwargs)
            compiled.append(name)

    if units and not compile_of_ddp and config.placement.order == "compile_then_to":
        compile_units()
        model.to(device)
    else:
        model.to(device)
        if not compile_of_ddp:
            compile_units()
    runner: nn.Module = model
    if distributed:
        runner = nn.parallel.DistributedDataParallel(model, **(ddp_kwargs or {}))
        if compile_of_ddp:
            runner.compile(**kwargs)
            compiled.append("DistributedDataParallel(model)")

    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    if knobs.optimizer and scope in ("module", "regional"):
        optimizer.step = torch.compile(optimizer.step, backend=knobs.backend)  # type: ignore[method-assign]
        compiled.append("optimizer.step")
    # Regional "inside" keeps an outer autocast for the uncompiled rest (embeddings, head), so
    # both placements compute in the same precision and differ only in where the context sits.
    outer = functools.partial(torch.autocast, device.type, dtype=dtype) if dtype is not None and not (
        inside and scope != "regional") else nullcontext
    compiled_autograd: Callable[[], AbstractContextManager[Any]] = nullcontext
    if knobs.compiled_autograd and scope in ("module", "regional"):
        backward_kwargs = {k: v for k, v in kwargs.items() if k != "fullgraph"}
        compiled_autograd = functools.partial(
            torch._dynamo.compiled_autograd._enable, torch.compile(**backward_kwargs))
        compiled.append("compiled_autograd")

    def optimizer_step(loss: torch.Tensor) -> None:
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    # CUDA graph trees reuse output memory on the next replay: each step starts a new generation,
    # and a loss that is a graph output (train_step) is copied out before it can be overwritten.
    cuda_graphs = device.type == "cuda" and scope != "none" and uses_cuda_graphs(kwargs)
    mark_step = torch.compiler.cudagraph_mark_step_begin if cuda_graphs else lambda: None

    if scope == "train_step":
        def whole_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device.type, dtype=dtype) if inside else nullcontext():
                loss = loss_fn(runner(inputs), targets)
            optimizer_step(loss)
            return loss.detach()

        compiled_step = torch.compile(whole_step, **kwargs)
        compiled.append("train_step")

        def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            mark_step()
            with outer():
                loss = compiled_step(inputs, targets)
            return loss.clone() if cuda_graphs else loss
    else:
        def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            mark_step()
            with compiled_autograd():
                with outer():
                    loss = loss_fn(runner(inputs), targets)
                optimizer_step(loss)
            return loss.detach()

    return TrainStep(fn=step, model=runner, compiled=compiled)


def _compile_units(model: nn.Module, knobs: CompileKnobs) -> list[tuple[str, nn.Module]]:
    """The modules handed to ``compile()`` in place (no ``_orig_mod.`` in the state dict)."""
    if knobs.scope == "module":
        return [("model", model)]
    name, blocks = find_blocks(model)
    if knobs.granularity == "sublayer":
        return [(f"{name}.{i}.{sub}", m) for i, block in enumerate(blocks) for sub, m in sublayers(block)]
    if knobs.granularity == "nested":
        # One marked function bound to every block, as the decorator on the class would be (one
        # region traced once, reused by each block), without changing the class for other users.
        region = torch.compiler.nested_compile_region(type(blocks[0]).forward)
        for block in blocks:
            block.forward = types.MethodType(region, block)  # type: ignore[method-assign]
        return [("model", model)]
    return [(f"{name}.{i}", block) for i, block in enumerate(blocks)]


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
