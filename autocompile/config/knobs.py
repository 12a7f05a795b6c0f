"""The knob table: every way of applying ``torch.compile`` that autocompile can measure.

Each knob is declared once, as a field of a frozen dataclass with :func:`knob` metadata (values, condition,
one-line doc) and a ``Literal`` type from :mod:`autocompile.config.choices`. The field's dotted path
(``compile.mode``) is its name everywhere: config key, Optuna parameter, MLflow param. How a knob is declared
is in :mod:`autocompile.config.knob_spec`; the parallel groups in :mod:`autocompile.config.parallel_knobs`.
Conditions only look at knobs declared before them, so a
configuration is validated (and sampled) in declaration order. A knob whose condition is false is
inactive: it holds its default, is not sampled and is not part of the configuration's identity, so no
trial is spent on a duplicate. This module imports only the standard library (torch lazily, in
:meth:`Env.detect`) because the worker runs it on machines that hold nothing but PyTorch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autocompile.config.choices import (
    MEMORY_BUDGETS,
    SCOPES,
    AcPolicy,
    AmpDtype,
    AmpPlacement,
    Backend,
    ClipPlacement,
    Granularity,
    Knobs,
    Mode,
    OptimImpl,
    PlacementOrder,
    Rest,
    Scope,
    values,
)
from autocompile.config.knob_spec import (
    BOOL,
    COMPILED,
    MODEL_COMPILED,
    REGIONAL,
    TRISTATE,
    Env,
    Flat,
    KnobSpec,
    Rule,
    knob,
)
from autocompile.config.parallel_knobs import USES_FSDP2, DdpKnobs, FsdpKnobs, ParallelKnobs

__all__ = ["KNOBS", "AcKnobs", "AmpKnobs", "CompileKnobs", "DdpKnobs", "Env", "FsdpKnobs", "KnobError", "OptimKnobs",
           "ParallelKnobs", "PlacementKnobs", "Rule", "TrialConfig", "describe", "knob"]

HAS_REST = Rule("the model has weights outside its repeated blocks and blocks are compiled one by one",
                lambda c, e: e.has_rest and c["compile.granularity"] != "nested")
NOT_TRAIN_STEP = Rule(
    "compile.scope is not train_step (its graph always breaks at loss.backward() and the optimizer)",
    lambda c, e: c["compile.scope"] != "train_step")
HAS_BLOCKS = Rule("the model has a repeated stack of blocks", lambda c, e: e.has_blocks)
INDUCTOR = Rule("compile.backend is inductor", lambda c, e: c["compile.backend"] == "inductor")
SHAPES_VARY = Rule("the workload varies sequence length", lambda c, e: e.shapes_vary)
AMP_ON = Rule("amp.dtype is not none", lambda c, e: c["amp.dtype"] != "none")
NOT_NESTED = Rule(
    "blocks are not nested compile regions (torch 2.13 inlines a nested region under checkpoint, and "
    "checkpoint inside one breaks the graph)",
    lambda c, e: not (c["compile.scope"] == "regional" and c["compile.granularity"] == "nested"),
)
NOT_COMPILE_OF_DDP = Rule(
    "DDP is not wrapped inside compile (placement is decided by DDP then)",
    lambda c, e: e.world_size == 1 or c["ddp.wrap_order"] != "compile_of_ddp",
)
NOT_WHOLE_UNDER_FSDP2 = Rule(
    "the model is not compiled whole under FSDP2 (module scope or nested regions: each block's fully_shard hooks, "
    "wrapped in dynamo.disable, sit inside the compiled forward and always break its graph)",
    lambda c, e: not (USES_FSDP2.test(c, e)
                      and (c["compile.scope"] == "module" or c["compile.granularity"] == "nested")))
NO_AUTOGRAD_UNDER_FSDP2 = Rule(
    "parallel.strategy is not fsdp2 (compiled autograd skips FSDP2's post-backward hooks: the modules stay "
    "unsharded, no gradient reaches the sharded parameters and training stops after the first step, torch 2.13)",
    lambda c, e: not USES_FSDP2.test(c, e))
NOT_FSDP2 = Rule(
    "parallel.strategy is not fsdp2 (fully_shard moves the parameters to its mesh's device itself)",
    lambda c, e: not USES_FSDP2.test(c, e))


OPTIMIZER_STEP_COMPILED = Rule(
    "the optimizer step is compiled (compile.optimizer, or compile.scope=train_step)",
    lambda c, e: c["compile.scope"] == "train_step" or (c["compile.scope"] in ("module", "regional")
                                                       and c["compile.optimizer"]))
SCHEDULED = Rule("the workload has an LR schedule", lambda c, e: e.scheduled)
IMPLS = Rule("the optimizer takes foreach/fused and the workload's optimizer sets neither",
             lambda c, e: bool(e.optimizer_impls))
CLIPS = Rule("the workload clips gradients (workload.grad_clip_norm > 0)", lambda c, e: e.clips)


def _modes(config: Flat, env: Env) -> tuple[str, ...]:
    # Accumulating, each micro-batch replays the backward graph over the gradients that AccumulateGrad took
    # from the graph pool on the micro-batch before (torch's "accessing gradient tensor output of CUDAGraphs
    # that has been overwritten", pytorch#169545).
    return tuple(mode for mode in env.modes if not (env.accumulates and mode in env.graph_modes))


def _scopes(config: Flat, env: Env) -> tuple[str, ...]:
    scopes = SCOPES if env.has_blocks else tuple(s for s in SCOPES if s != "regional")
    return scopes[:-1] if env.script_mode else scopes  # a script's train step is its own code


def _granularities(config: Flat, env: Env) -> tuple[str, ...]:
    # Nested regions are for structurally identical blocks: torch 2.13 reuses one region's graph across
    # blocks of other widths (ResNet's stages: a shape error) or other parameters (T5's first block).
    nested = env.nested_regions and env.same_blocks
    return ("block", *(("sublayer",) if env.splits_blocks else ()), *(("nested",) if nested else ()))


def _amp_dtypes(config: Flat, env: Env) -> tuple[str, ...]:
    # fp16 on CPU is slower than fp32 and needs no trial to say so. (fp16 with a CUDA-graph train_step stays
    # offered: on an H100 with torch 2.11 its GradScaler kept CUDA graphs, 0 cudagraph_skips; a torch that skips
    # them fails the trial as cudagraphs_skipped.)
    if env.device != "cuda":
        return ("none", "bfloat16")
    return ("none", "bfloat16", "float16")


def _ac_policies(config: Flat, env: Env) -> tuple[str, ...]:  # budgets steer AOTAutograd's min-cut partitioner
    aot = env.memory_budget and COMPILED.test(config, env) and config["compile.backend"] in ("inductor", "aot_eager")
    return ("none", "block", *(MEMORY_BUDGETS if aot else ()))


def _optimizer_impls(config: Flat, env: Env) -> tuple[str, ...]:
    # Dynamo wraps every fused optimizer kernel in torch.compiler.disable ("don't trace into fused
    # optimizer"): a compiled step with fused=True runs the fused kernel uncompiled between graph breaks.
    step_compiled = OPTIMIZER_STEP_COMPILED.test(config, env)
    return ("default", *(impl for impl in env.optimizer_impls if not (step_compiled and impl == "fused")))


def _inductor_option(name: str, doc: str) -> Any:
    """A tri-state inductor option, searched only in the extended space (``None``: the mode's own)."""
    return knob(None, values=TRISTATE, when=COMPILED & INDUCTOR, extended=True,
                api=f"torch.compile(options={{'{name}': ...}})", doc=doc)


@dataclass(frozen=True)
class InductorOptions:
    """Inductor options merged over the mode's own (``None``: leave the mode's setting)."""

    coordinate_descent_tuning: bool | None = _inductor_option(
        "coordinate_descent_tuning", "Tune Triton/C++ kernel launch parameters by coordinate descent.")
    shape_padding: bool | None = _inductor_option(
        "shape_padding", "Pad matmul shapes to hardware-friendly multiples.")
    epilogue_fusion: bool | None = _inductor_option(
        "epilogue_fusion", "Fuse pointwise epilogues into matmul templates.")
    aggressive_fusion: bool | None = _inductor_option(
        "aggressive_fusion", "Fuse nodes even without shared memory reads.")
    size_asserts: bool | None = _inductor_option(
        "size_asserts", "Check each input's size and stride in the generated code (False: less Python work per call).")


@dataclass(frozen=True)
class CompileKnobs:
    """Where and how ``torch.compile`` is applied."""

    scope: Scope = knob(
        "module", values=_scopes,
        api="torch.compile(model) / model.compile() / torch.compile(train_step)",
        doc="What is compiled: nothing (eager), the model, each repeated block (regional), or the train step "
            "function (forward, loss and optimizer in one torch.compile; the backward runs outside its graphs).",
        question="Compile the module, its blocks, or the whole train step?")
    granularity: Granularity = knob(
        "block", values=_granularities, when=REGIONAL,
        api="torch.compile per block or sublayer; torch.compiler.nested_compile_region",
        doc="Regional unit: each block, each sublayer in a block, or blocks as nested regions of one compile.",
        question="Regional compile: per block, per sublayer, or nested regions?")
    rest: Rest = knob(
        "compiled", values=values(Rest), when=REGIONAL & HAS_REST,
        api="torch.compile of each remaining unit (Accelerate's compile_regions)",
        doc="Regional: the rest of the model (embeddings, final norm, head) compiled unit by unit as "
            "Accelerate's compile_regions does, or left eager.",
        question="Regional compile: compile the rest of the model too, or leave it eager?")
    backend: Backend = knob(
        "inductor", values=values(Backend), search=("inductor",), when=COMPILED,
        api="torch.compile(backend=...)",
        doc="torch.compile backend; aot_eager/eager are for tests and debugging.")
    mode: Mode = knob(
        "default", values=_modes, when=COMPILED & INDUCTOR,
        api="torch.compile(mode=...); torch._inductor.list_mode_options()",
        doc="Inductor mode (its options come from torch._inductor.list_mode_options). CUDA-graph modes "
            "(reduce-overhead, max-autotune) only on CUDA and with workload.grad_accum_steps=1: each micro-batch's "
            "replay would overwrite the gradients accumulated from the one before (accumulate in a mode without "
            "CUDA graphs, or raise workload.batch_size and set grad_accum_steps=1).",
        question="Which compile mode?")
    dynamic: bool | None = knob(
        None, values=TRISTATE, when=COMPILED & SHAPES_VARY,
        api="torch.compile(dynamic=...)",
        doc="Dynamic shapes: None = automatic after a recompile, True = from the start, False = never.",
        question="dynamic=None, True or False?")
    fullgraph: bool = knob(
        False, values=BOOL, when=COMPILED & NOT_TRAIN_STEP & NOT_WHOLE_UNDER_FSDP2,
        api="torch.compile(fullgraph=...)",
        doc="Fail on any graph break instead of splitting the graph.", question="Does fullgraph=True pay?")
    optimizer: bool = knob(
        False, values=BOOL, when=MODEL_COMPILED,
        api="torch.compile(optimizer.step)",
        doc="Also compile optimizer.step (the compiled-optimizer recipe).", question="Compile the optimizer step too?")
    compiled_autograd: bool = knob(
        False, values=BOOL, when=MODEL_COMPILED & NO_AUTOGRAD_UNDER_FSDP2,
        api="torch._dynamo.compiled_autograd._enable(torch.compile(...))",
        doc="Trace the backward with compiled autograd around forward and backward.",
        question="Compiled autograd or not?")
    options: InductorOptions = field(default_factory=InductorOptions)


@dataclass(frozen=True)
class AmpKnobs:
    """Automatic mixed precision."""

    dtype: AmpDtype = knob(
        "none", values=_amp_dtypes,
        api="torch.autocast(dtype=...); torch.amp.GradScaler for float16",
        doc="Autocast dtype; float16 adds a GradScaler.",
        question="Mixed precision, and which dtype?")
    placement: AmpPlacement = knob(
        "outside", values=values(AmpPlacement), when=AMP_ON & COMPILED,
        api="torch.autocast around or inside the compiled function",
        doc="Autocast around the call of the compiled code, or inside the compiled region.",
        question="Autocast inside or outside the compiled region?")


@dataclass(frozen=True)
class PlacementKnobs:
    """Order of moving the model to its device and compiling it."""

    order: PlacementOrder = knob(
        "to_then_compile", values=values(PlacementOrder),
        when=MODEL_COMPILED & NOT_COMPILE_OF_DDP & NOT_FSDP2,
        api="model.to(device) before or after torch.compile",
        doc="model.to(device) before or after torch.compile.", question=".to(device) before or after compile?")


@dataclass(frozen=True)
class AcKnobs:
    """Activation checkpointing."""

    policy: AcPolicy = knob(
        "none", values=_ac_policies, when=NOT_NESTED & HAS_BLOCKS,
        api="torch.utils.checkpoint.checkpoint per block; torch._functorch.config.activation_memory_budget",
        doc="Recompute activations in backward: each block's (torch.utils.checkpoint), or what compile's min-cut "
            "partitioner keeps within a budget (budget_0.5: half the saved bytes; inductor or aot_eager, where the "
            "torch has it; its peak memory is not monotonic in the budget, pytorch#197838).",
        question="Activation checkpointing: per block, compile's memory budget, or none?")


@dataclass(frozen=True)
class OptimKnobs:
    """How the optimizer step runs, and how the workload's schedule and clipping meet compiled code."""

    impl: OptimImpl = knob(
        "default", values=_optimizer_impls, when=IMPLS,
        api="torch.optim.<Optimizer>(foreach=..., fused=...)",
        doc="Optimizer implementation: torch's default for the device (foreach on CUDA, for-loop on CPU), "
            "for_loop, foreach (multi-tensor) or fused kernels. fused only where the optimizer step is not "
            "compiled: dynamo never traces a fused kernel (torch.compiler.disable), so compiling it adds nothing.",
        question="Which optimizer implementation: default, foreach or fused?")
    tensor_lr: bool = knob(
        True, values=BOOL, search=(True,), when=OPTIMIZER_STEP_COMPILED & SCHEDULED,
        api="torch.optim.<Optimizer>(lr=torch.tensor(...))",
        doc="The compiled-optimizer-with-scheduler recipe: the learning rate as a tensor, so a scheduler's "
            "change is data, not a recompile (False = a Python float: dynamo guards on it and recompiles the "
            "optimizer step every step where it specialises it, e.g. foreach). Not searched: False is for showing it.")
    clip: ClipPlacement = knob(
        "eager", values=values(ClipPlacement), when=CLIPS & MODEL_COMPILED,
        api="torch.nn.utils.clip_grad_norm_ (eager or compiled)",
        doc="Gradient clipping (clip_grad_norm_) in eager code between backward and step, or compiled: inside "
            "the compiled optimizer step when compile.optimizer, else a compiled function of its own.",
        question="Clip gradients in eager or in compiled code?")


@dataclass(frozen=True)
class TrialConfig:
    """One compile configuration; build it with :meth:`from_flat` so it is validated."""

    parallel: ParallelKnobs = field(default_factory=ParallelKnobs)
    compile: CompileKnobs = field(default_factory=CompileKnobs)
    amp: AmpKnobs = field(default_factory=AmpKnobs)
    ddp: DdpKnobs = field(default_factory=DdpKnobs)
    fsdp: FsdpKnobs = field(default_factory=FsdpKnobs)
    placement: PlacementKnobs = field(default_factory=PlacementKnobs)
    ac: AcKnobs = field(default_factory=AcKnobs)
    optim: OptimKnobs = field(default_factory=OptimKnobs)

    @classmethod
    def from_flat(cls, values: Flat, env: Env, *, strict: bool = True) -> TrialConfig:
        """Validate dotted-key values into a config; missing knobs take their defaults.

        ``strict`` rejects a value given for a knob that does not apply; otherwise such a value
        is dropped (a knob fixed for a whole study may not apply to every sampled trial).
        """
        unknown = sorted(set(values) - set(KNOBS))
        if unknown:
            raise KnobError(f"unknown knob {unknown[0]!r}; known knobs: {', '.join(KNOBS)}")
        flat: Knobs = {}
        for key, (spec, default) in KNOBS.items():
            value = values.get(key, default)
            if spec.when is not None and not spec.when.test(flat, env):
                if strict and key in values and value != default:
                    raise KnobError(f"{key}={value!r} does not apply: it needs {spec.when.text}; drop it")
                value = default
            else:
                allowed = spec.allowed(flat, env)
                if key not in values and value not in allowed:
                    value = allowed[0]  # the default is ruled out by an earlier knob: take the first valid
                if value not in allowed:
                    raise KnobError(
                        f"{key}={value!r} is not valid here; choose one of {', '.join(map(repr, allowed))} "
                        f"({key}: {spec.doc})")
            flat[key] = value
        return _unflatten(cls, flat)

    def flat(self) -> Knobs:
        """Every knob's value under its dotted key."""
        return dict(_walk(self))

    def active(self, env: Env) -> Knobs:
        """Only the knobs that apply here: the configuration's identity for dedupe and logging."""
        flat = self.flat()
        return {
            key: flat[key] for key, (spec, _) in KNOBS.items()
            if spec.when is None or spec.when.test(flat, env)
        }


class KnobError(ValueError):
    """A knob name or value that cannot be measured; the message says how to fix it."""


def _knob_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, KnobSpec, Any]]:
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if "knob" in f.metadata:
            yield key, f.metadata["knob"], f.default
        else:
            yield from _knob_fields(f.default_factory, f"{key}.")  # type: ignore[arg-type]


def _walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _unflatten(cls: type, flat: Flat, prefix: str = "") -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        kwargs[f.name] = flat[key] if "knob" in f.metadata else _unflatten(f.default_factory, flat, f"{key}.")
    return cls(**kwargs)


KNOBS: dict[str, tuple[KnobSpec, Any]] = {key: (spec, default) for key, spec, default in _knob_fields(TrialConfig)}
"""Every knob in declaration order: dotted key -> (spec, default)."""

# The user's own script (script.path, Env.script_mode): its agent reaches the script's torch.compile calls and
# dynamo's settings, not the objects the script builds and drives itself. These knobs keep their defaults there
# (the knobs under them follow), each saying which line in the script would open it.
SCRIPT_NEEDS = {
    "parallel.strategy": "autocompile.apply in the script (the script wraps the model itself)",
    "compile.optimizer": "autocompile.apply in the script (its optimizer step)",
    "compile.compiled_autograd": "autocompile.apply in the script (its backward)",
    "amp.dtype": "autocompile.apply in the script (it runs its own autocast)",
    "ddp.wrap_order": "autocompile.prepare(model, optimizer) in the script, before it wraps DDP",
    "placement.order": "autocompile.apply in the script (it moves the model itself)",
    "ac.policy": "autocompile.prepare(model, optimizer) in the script (its blocks' forward)",
    "optim.impl": "autocompile.prepare(model, optimizer) in the script (it builds its optimizer)",
    "optim.tensor_lr": "autocompile.apply in the script (its optimizer's learning rate)",
    "optim.clip": "autocompile.apply in the script (its clipping)",
}
PREPARE_OPENS = ("ac.policy", "optim.impl", "ddp.wrap_order")
"""Of those, what ``autocompile.prepare`` applies inside a trial (``Env.script_prepares``)."""
for _key, _needs in SCRIPT_NEEDS.items():
    _spec, _default = KNOBS[_key]
    if _key in PREPARE_OPENS:
        _own = Rule(f"a job autocompile runs, or a script that calls autocompile.prepare (a script reaches it "
                    f"through {_needs})", lambda c, e: not e.script_mode or e.script_prepares)
    else:
        _own = Rule(f"a job autocompile runs (a script reaches it through {_needs})", lambda c, e: not e.script_mode)
    KNOBS[_key] = (dataclasses.replace(_spec, when=_own & _spec.when if _spec.when else _own), _default)


def describe(config: TrialConfig, env: Env) -> str:
    """Short human name: the active knobs that differ from their defaults."""
    changed = [f"{k}={v}" for k, v in config.active(env).items() if v != KNOBS[k][1]]
    return ", ".join(changed) if changed else "defaults"
