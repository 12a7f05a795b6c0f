"""The parts :func:`autocompile.trial.program.step.apply` composes: one function per knob group, each over its own
section of the configuration (``config.ac``, ``config.amp``, ``config.ddp``, ``config.fsdp``,
``config.placement``, ``config.optim``, ``config.compile``), as torchtitan's ``parallelize_llama`` composes
``apply_ac``, ``apply_compile`` and ``apply_fsdp``/``apply_ddp``. A new knob is a field in the knob table,
a function (or a line) here, its call in ``apply`` and its test.

Each part mutates what it is given as ``apply`` documents (a unit's ``forward``, ``optimizer.step``, the
process's ``optimize_ddp``) and returns what later parts need, so each can be called and tested alone.

Torch only: the worker runs this where nothing else is installed.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import torch
from torch import nn

from autocompile.config.choices import UNIT_SCOPES, Backend, DdpOptimize, compiles
from autocompile.config.knobs import AcKnobs, AmpKnobs, CompileKnobs, DdpKnobs, FsdpKnobs, OptimKnobs, PlacementKnobs
from autocompile.config.torch_private import compiled_autograd_context, dynamo_config
from autocompile.trial.program.graphs import CompileLog, Options, Recorder
from autocompile.workload import units
from autocompile.workload.optim import (
    OptimizerLike,
    ScheduleLike,
    build_optimizer,
    build_schedule,
    clipper,
    use_tensor_lr,
)

Unit = tuple[str, nn.Module]
Context = Callable[[], AbstractContextManager[Any]]

AMP_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZE_DDP: dict[DdpOptimize, bool | Literal["python_reducer"]] = {
    "ddp_optimizer": True, "no_optimization": False, "python_reducer": "python_reducer"}
"""Scopes that compile the model's own units; only these also compile the optimizer, clipping or autograd apart."""

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy


class _CompileArgs(TypedDict):
    backend: Backend
    fullgraph: bool
    dynamic: bool | None


class CompileKwargs(_CompileArgs, total=False):
    """``torch.compile``'s keyword arguments for one configuration (``step.compile_kwargs``): ``mode`` or
    ``options``, never both (together they raise), neither for the default mode or another backend."""

    mode: str
    options: Options
    """The mode's own options with ``compile.options.*`` merged over them."""


class DynamoSettings(TypedDict, total=False):
    """Process-global dynamo settings a step was built under (``torch._dynamo.config.patch(**settings)``)."""

    optimize_ddp: bool | Literal["python_reducer"]
    """``ddp.optimize``: set only when the step is distributed."""


class DdpKwargs(TypedDict, total=False):
    """``DistributedDataParallel``'s keyword arguments, passed through ``apply(ddp_kwargs=...)`` (the torch in
    use decides which it takes)."""

    device_ids: list[int] | list[torch.device] | None
    output_device: int | torch.device | None
    dim: int
    broadcast_buffers: bool | None
    init_sync: bool
    process_group: ProcessGroup | None
    bucket_cap_mb: float | None
    find_unused_parameters: bool
    check_reduction: bool
    gradient_as_bucket_view: bool
    static_graph: bool
    delay_all_reduce_named_params: list[tuple[str, nn.Parameter]] | None
    param_to_hook_all_reduce: nn.Parameter | None
    mixed_precision: Any  # torch's private _MixedPrecision, or None
    device_mesh: DeviceMesh | None
    skip_all_reduce_unused_params: bool


class _FsdpArgs(TypedDict):
    mesh: DeviceMesh
    reshard_after_forward: bool


class FsdpKwargs(_FsdpArgs, total=False):
    """``fully_shard``'s keyword arguments under ``parallel.strategy=fsdp2`` (:func:`apply_fsdp`)."""

    mp_policy: MixedPrecisionPolicy
    """``fsdp.mp_policy=bf16`` only."""


class Compilers:
    """``torch.compile`` for one role (``model``, ``optimizer``, ``clip``, ``autograd``, ``train_step``) with
    that role's :class:`Recorder` as backend, every graph noted in one :class:`CompileLog`."""

    def __init__(self, log: CompileLog, kwargs: CompileKwargs, memory_budget: float | None = None) -> None:
        self.log, self.kwargs, self.memory_budget = log, kwargs, memory_budget

    def __call__(self, role: str, **overrides: Any) -> Callable[[Any], Any]:
        """One backend object per call: call it once per role and reuse the result, so same-class units
        share their graph (a new backend object per unit would recompile each one)."""
        merged = {**self.kwargs, **overrides}
        backend = Recorder(self.log, role, merged["backend"], merged.get("mode"), merged.get("options"),
                           merged["dynamic"], self.memory_budget)
        return functools.partial(torch.compile, backend=backend, fullgraph=merged["fullgraph"],
                                 dynamic=merged["dynamic"])

    def bare(self, role: str) -> Callable[[Any], Any]:
        """The compiled-optimizer recipe: the backend alone, no mode or fullgraph (it breaks by design)."""
        return self(role, mode=None, options=None, fullgraph=False, dynamic=None)


def apply_ac(model: nn.Module, ac: AcKnobs) -> list[str]:
    """``ac.policy=block``: each repeated block recomputes its activations in backward. A leaf block (a
    head in a stack of heads) has no activations worth recomputing. Returns the blocks checkpointed."""
    if ac.policy != "block":
        return []
    done = []
    for name, block in units.blocks(model):
        if any(True for _ in block.children()):
            _wrap_forward(block, _checkpointed)
            done.append(name)
    return done


def compile_targets(model: nn.Module, knobs: CompileKnobs) -> list[Unit]:
    """The modules whose ``forward`` is compiled in place: the model (``module``; ``nested`` after marking
    each block a region), each block and the rest (``regional``), none for ``none`` and ``train_step``."""
    if knobs.scope not in UNIT_SCOPES:
        return []
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
    # Each module object once (a sublayer shared by blocks): a second compile would wrap the first.
    return units.distinct(found + (units.rest(model) if knobs.rest == "compiled" else []))


def autocast_inside(amp: AmpKnobs, scope: str) -> bool:
    """Whether autocast sits inside compiled code (``amp.placement=inside`` with a dtype and something compiled)."""
    return AMP_DTYPES[amp.dtype] is not None and compiles(scope) and amp.placement == "inside"


def apply_autocast(targets: list[Unit], amp: AmpKnobs, scope: str, device: torch.device) -> None:
    """``amp.placement=inside``: each compiled unit's forward enters autocast, so the context is traced into
    its graph (``train_step`` enters it inside its compiled function: :func:`inner_autocast`)."""
    if autocast_inside(amp, scope) and scope != "train_step":
        dtype = AMP_DTYPES[amp.dtype]
        for _, unit in targets:
            _wrap_forward(unit, lambda fwd: _autocast(fwd, device.type, dtype))


def outer_autocast(amp: AmpKnobs, scope: str, device: torch.device) -> Context:
    """The autocast around each micro-step's forward and loss in eager code. Regional ``inside`` keeps it
    for the uncompiled rest (embeddings, head), so both placements compute in the same precision and differ
    only in where the context sits."""
    dtype = AMP_DTYPES[amp.dtype]
    if dtype is None or (autocast_inside(amp, scope) and scope != "regional"):
        return nullcontext
    return functools.partial(torch.autocast, device.type, dtype=dtype)


def inner_autocast(amp: AmpKnobs, scope: str) -> torch.dtype | None:
    """The autocast dtype ``train_step`` enters inside its compiled function (``amp.placement=inside``), or None."""
    return AMP_DTYPES[amp.dtype] if scope == "train_step" and autocast_inside(amp, scope) else None


def apply_optimize_ddp(ddp: DdpKnobs, distributed: bool) -> DynamoSettings:
    """Set ``torch._dynamo.config.optimize_ddp`` (``ddp.optimize``) and return it as the step's process-global
    settings. Before the model is wrapped: DDP reads it in ``__init__`` (python reducer), dynamo when it
    compiles DDP graphs."""
    if not distributed:
        return {}
    value = dynamo_config().optimize_ddp = OPTIMIZE_DDP[ddp.optimize]
    return {"optimize_ddp": value}


def compiles_ddp(ddp: DdpKnobs, scope: str, distributed: bool) -> bool:
    """``ddp.wrap_order=compile_of_ddp``: ``torch.compile`` wraps the DDP module instead of DDP wrapping the
    compiled model."""
    return distributed and scope == "module" and ddp.wrap_order == "compile_of_ddp"


def place_and_compile(model: nn.Module, targets: list[Unit], placement: PlacementKnobs, device: torch.device,
                      compile_model: Callable[[Any], Any], log: CompileLog) -> list[str]:
    """Compile ``targets`` and move the model to ``device`` in ``placement.order``; returns the names compiled.
    ``.to()`` keeps parameter identity, so either order leaves the same parameters in the compiled units."""
    if targets and placement.order == "compile_then_to":
        compiled = compile_units(targets, compile_model, log)
        model.to(device)
        return compiled
    model.to(device)
    return compile_units(targets, compile_model, log)


def compile_units(targets: list[Unit], compile_model: Callable[[Any], Any], log: CompileLog) -> list[str]:
    """Compile each unit through its ``forward``, entry counted in ``log``; returns their names.

    Not ``module.compile()``: that compiles ``_call_impl``, and when the forward is defined inside torch
    (nn.Sequential, nn.TransformerEncoderLayer, nn.Linear) dynamo finds no frame of its own to trace and the
    unit silently runs eager. An instance attribute keeps the state dict free of ``_orig_mod.``."""
    for name, unit in targets:
        _compile_forward(unit, compile_model, functools.partial(log.counted, name))
    return [name for name, _ in targets]


def apply_ddp(model: nn.Module, compile_model: Callable[[Any], Any], compile_of_ddp: bool,
              ddp_kwargs: DdpKwargs | None) -> tuple[nn.Module, nn.parallel.DistributedDataParallel]:
    """Wrap the model in DDP; ``compile_of_ddp`` compiles the wrapper (dynamo then splits its graph at bucket
    boundaries as ``optimize_ddp`` says). Returns what the forward runs through and the DDP module."""
    ddp = nn.parallel.DistributedDataParallel(model, **(ddp_kwargs or {}))
    return (compile_model(ddp) if compile_of_ddp else ddp), ddp


def apply_fsdp(model: nn.Module, targets: list[Unit], fsdp: FsdpKnobs, device: torch.device,
               compile_model: Callable[[Any], Any], log: CompileLog) -> tuple[list[str], list[str]]:
    """``parallel.strategy=fsdp2``: ``fully_shard`` on each repeated block, then on the root (its own parameters:
    embeddings, final norm, head), as torchtitan does, on a 1-D mesh of every rank; ``targets`` are compiled
    before sharding (``fsdp.order=compile_then_shard``, torchtitan's order) or after. Returns the names compiled
    and the modules sharded (``model`` for the root).

    Units are compiled through their ``forward``, so FSDP2's all-gather and reshard hooks (in ``__call__``,
    wrapped in ``dynamo.disable``) run eagerly around each compiled block in either order; under module scope the
    blocks' hooks sit inside the model's compiled forward and break its graph at each block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    kwargs: FsdpKwargs = {"mesh": mesh, "reshard_after_forward": fsdp.reshard_after_forward}
    if fsdp.mp_policy == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model.to(device)
    compiled = compile_units(targets, compile_model, log) if fsdp.order == "compile_then_shard" else []
    blocks = units.stacks_blocks(model)
    for _, block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    if fsdp.order == "shard_then_compile":
        compiled = compile_units(targets, compile_model, log)
    return compiled, [name for name, _ in blocks] + ["model"]


def step_compiled(knobs: CompileKnobs) -> bool:
    """Whether ``optimizer.step`` runs compiled: inside ``train_step``, or ``compile.optimizer`` on units."""
    return knobs.scope == "train_step" or (knobs.optimizer and knobs.scope in UNIT_SCOPES)


def apply_optim(optimizer: OptimizerLike, model: nn.Module, optim: OptimKnobs, lr_schedule: ScheduleLike,
                compiled_step: bool, device: torch.device) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer with ``optim.impl``'s implementation, built once the parameters are on their device
    (fused kernels check it); its LR a tensor where a scheduled step is compiled (``optim.tensor_lr``), so
    a changed LR is data rather than a recompile; then the scheduler, which records that LR as the initial."""
    built = build_optimizer(optimizer, model.parameters(), optim.impl)
    if lr_schedule is not None and compiled_step and optim.tensor_lr:
        use_tensor_lr(built, device)
    return built, build_schedule(lr_schedule, built)


def clipping(optimizer: torch.optim.Optimizer, grad_clip_norm: float) -> Callable[[], Any] | None:
    """``clip_grad_norm_`` over the parameters the optimizer steps, or None without clipping."""
    if grad_clip_norm <= 0:
        return None
    return clipper([p for group in optimizer.param_groups for p in group["params"]], grad_clip_norm)


def grad_scaler(amp: AmpKnobs, device: torch.device) -> torch.amp.GradScaler | None:
    """float16 needs loss scaling (small gradients underflow its range); bfloat16 and float32 do not."""
    return torch.amp.GradScaler(device.type) if amp.dtype == "float16" else None


def apply_compiled_update(optimizer: torch.optim.Optimizer, clip: Callable[[], Any] | None, knobs: CompileKnobs,
                          optim: OptimKnobs, compilers: Compilers) -> tuple[Callable[[], Any] | None, list[str]]:
    """``compile.optimizer`` compiles ``optimizer.step``, with the clipping inside when ``optim.clip=compiled``
    (a GradScaler unscales before calling it, as it must); without it, ``optim.clip=compiled`` compiles the
    clipping alone. Returns the clipping left to call before each step (None: none, or inside the step)
    and the names compiled."""
    clip_compiled = clip is not None and knobs.scope in UNIT_SCOPES and optim.clip == "compiled"
    if knobs.optimizer and knobs.scope in UNIT_SCOPES:
        step = _clip_then(clip, optimizer.step) if clip is not None and clip_compiled else optimizer.step
        optimizer.step = compilers.bare("optimizer")(step)  # type: ignore[method-assign]
        return (None, ["optimizer.step+clip_grad_norm_"]) if clip_compiled else (clip, ["optimizer.step"])
    if clip_compiled:
        return compilers.bare("clip")(clip), ["clip_grad_norm_"]
    return clip, []


def compiled_autograd(knobs: CompileKnobs, compilers: Compilers) -> tuple[Context, list[str]]:
    """``compile.compiled_autograd``: the context each micro-step's forward and backward run in, so the
    backward is captured as a graph at run time (the model's backend and mode, never fullgraph)."""
    if not (knobs.compiled_autograd and knobs.scope in UNIT_SCOPES):
        return nullcontext, []
    backward = compilers("autograd", fullgraph=False)
    return functools.partial(compiled_autograd_context, backward()), ["compiled_autograd"]


def _clip_then(clip: Callable[[], Any], step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` preceded by ``clip``: one function, so both are traced into the compiled optimizer step."""
    def clip_and_step(*args: Any, **kwargs: Any) -> Any:
        clip()
        return step(*args, **kwargs)

    return clip_and_step


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
    """``module.forward`` replaced by ``wrapper`` of it, as an instance attribute (the class is left alone)."""
    module.forward = wrapper(module.forward)  # type: ignore[method-assign]


def _checkpointed(fwd: Callable[..., Any]) -> Callable[..., Any]:
    """``fwd`` under non-reentrant checkpointing. A plain function, not ``functools.partial(checkpoint, ...)``:
    dynamo skipped the frame of a block whose forward was such a partial, so regional compile silently
    compiled nothing (torch 2.13)."""
    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(fwd, *args, use_reentrant=False, **kwargs)

    return forward


def _autocast(fwd: Callable[..., Any], device_type: str, dtype: torch.dtype | None) -> Callable[..., Any]:
    """``fwd`` entering autocast itself, so a compiled unit traces the context into its graph."""
    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return fwd(*args, **kwargs)

    return forward
