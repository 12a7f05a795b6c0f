"""The knobs of training on more than one process: the strategy (DDP or FSDP2) and each strategy's own
questions, declared here once and gathered into :class:`autocompile.config.knobs.TrialConfig`.

``parallel.strategy`` is the first knob of the table (it reads only the world size), so every later
knob's condition may read it. Standard library only, like the rest of the knob table.
"""

from __future__ import annotations

from dataclasses import dataclass

from autocompile.config.choices import DdpOptimize, FsdpOrder, MpPolicy, Strategy, WrapOrder, values
from autocompile.config.knob_spec import (
    BOOL,
    COMPILED,
    DISTRIBUTED,
    MODEL_COMPILED,
    MODULE_SCOPE,
    Env,
    Flat,
    Rule,
    knob,
)

USES_DDP = Rule("world size > 1 and parallel.strategy is ddp",
                lambda c, e: e.world_size > 1 and c["parallel.strategy"] == "ddp")
USES_FSDP2 = Rule("world size > 1 and parallel.strategy is fsdp2",
                  lambda c, e: e.world_size > 1 and c["parallel.strategy"] == "fsdp2")
NOT_FP16 = Rule(
    "amp.dtype is not float16 (float16 autocast over bf16 parameters hands autocast's fp32 ops, layer_norm "
    "among them, fp32 inputs with bf16 weights: 'mixed dtype' on CPU, torch 2.13)",
    lambda c, e: c["amp.dtype"] != "float16")


def _ddp_modes(config: Flat, env: Env) -> tuple[str, ...]:
    # Compiled autograd rejects every C++-reducer mode, and python_reducer is a no-op without it.
    # python_reducer_without_compiled_forward behaves as no_optimization in DDP: not offered.
    if config["compile.compiled_autograd"]:
        return ("python_reducer",)
    return ("ddp_optimizer", "no_optimization")


@dataclass(frozen=True)
class ParallelKnobs:
    """How the processes share the model, only when more than one process trains."""

    strategy: Strategy = knob(
        "ddp", values=values(Strategy), when=DISTRIBUTED,
        api="torch.nn.parallel.DistributedDataParallel / torch.distributed.fsdp.fully_shard",
        doc="DDP (a replica of the model per rank, gradients all-reduced) or FSDP2 (torch.distributed.fsdp."
            "fully_shard on each repeated block and on the root, as torchtitan does: parameters sharded across "
            "ranks, all-gathered around each block's forward and backward, gradients reduce-scattered).",
        question="DDP or FSDP2?")


@dataclass(frozen=True)
class DdpKnobs:
    """DistributedDataParallel, only when ``parallel.strategy=ddp``."""

    wrap_order: WrapOrder = knob(
        "ddp_of_compiled", values=values(WrapOrder), when=USES_DDP & MODULE_SCOPE,
        api="DistributedDataParallel(torch.compile(m)) or torch.compile(DistributedDataParallel(m))",
        doc="DDP(compiled model) or torch.compile(DDP(model)).", question="Wrap DDP before or after compile?")
    optimize: DdpOptimize = knob(
        "ddp_optimizer", values=_ddp_modes, when=USES_DDP & COMPILED,
        api="torch._dynamo.config.optimize_ddp",
        doc="torch._dynamo.config.optimize_ddp: split graphs at buckets, plain, or the Python reducer.",
        question="Which DDP reducer (optimize_ddp)?")


@dataclass(frozen=True)
class FsdpKnobs:
    """FSDP2 (``fully_shard``), only when ``parallel.strategy=fsdp2``."""

    order: FsdpOrder = knob(
        "compile_then_shard", values=values(FsdpOrder), when=USES_FSDP2 & MODEL_COMPILED,
        api="torch.compile then fully_shard, or fully_shard then torch.compile",
        doc="torch.compile of the units before fully_shard (torchtitan's order) or after it. Units are compiled "
            "through their forward, so FSDP2's hooks (in the module's __call__, wrapped in dynamo.disable) run "
            "outside the compiled code in either order.",
        question="FSDP2: shard then compile, or compile then shard?")
    reshard_after_forward: bool = knob(
        True, values=BOOL, when=USES_FSDP2,
        api="fully_shard(reshard_after_forward=...)",
        doc="Free each block's all-gathered parameters after its forward (all-gather them again for the backward) "
            "or keep them until the backward (more memory, one all-gather fewer per block).",
        question="FSDP2: reshard parameters after forward?")
    mp_policy: MpPolicy = knob(
        "none", values=values(MpPolicy), when=USES_FSDP2 & NOT_FP16,
        api="torch.distributed.fsdp.MixedPrecisionPolicy",
        doc="FSDP2's mixed precision: bf16 = MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), "
            "parameters all-gathered and computed in bf16, gradients reduced in fp32; none = the parameters' own "
            "dtype. amp.dtype (autocast) applies on top of it, as Accelerate does; torchtitan uses this alone.",
        question="FSDP2 mixed precision (bf16 parameters, fp32 reductions)?")
