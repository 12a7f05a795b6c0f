"""The closed choices of the knob table and the study, as ``Literal`` types: one place per set of values.

A knob's field in :mod:`autocompile.config.knobs` is annotated with its type here, and its declared values are
read from it (``tests/test_knobs.py`` holds every knob's values to its ``Literal``), so a misspelt value is a
type error and a new one is added once. The predicates below are the only places that compare a scope with a
string outside the knob declarations and ``apply()``.
"""

from __future__ import annotations

from typing import Literal, get_args

Scope = Literal["none", "module", "regional", "train_step"]
"""Where ``torch.compile`` goes: nowhere (eager), the model, each repeated block, or the whole train step."""
Granularity = Literal["block", "sublayer", "nested"]
Rest = Literal["compiled", "eager"]
Backend = Literal["inductor", "aot_eager", "eager"]
Mode = Literal["default", "lite", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
"""``torch.compile`` modes this project knows; the running torch's ``list_mode_options()`` decides which exist."""
AmpDtype = Literal["none", "bfloat16", "float16"]
AmpPlacement = Literal["outside", "inside"]
PlacementOrder = Literal["to_then_compile", "compile_then_to"]
AcPolicy = Literal["none", "block", "budget_0.5", "budget_0.25"]
"""No checkpointing, per-block ``torch.utils.checkpoint``, or compile's own selective recompute at an activation
memory budget (``torch._functorch.config.activation_memory_budget``: the share of the saved activations kept)."""
OptimImpl = Literal["default", "for_loop", "foreach", "fused"]
ClipPlacement = Literal["eager", "compiled"]
Strategy = Literal["ddp", "fsdp2"]
WrapOrder = Literal["ddp_of_compiled", "compile_of_ddp"]
DdpOptimize = Literal["ddp_optimizer", "python_reducer", "python_reducer_without_compiled_forward",
                      "no_optimization"]
FsdpOrder = Literal["shard_then_compile", "compile_then_shard"]
MpPolicy = Literal["none", "bf16"]
Method = Literal["side_by_side", "fresh_processes"]
"""How a phase timed its candidates: together in each process, or one fresh process per candidate and round."""

KnobValue = str | int | float | bool | None
"""A knob's value in a flat configuration (what Optuna stores as a categorical parameter)."""
Knobs = dict[str, KnobValue]
"""A flat configuration: dotted knob name -> value (``TrialConfig.flat``; a trial's ``params``)."""

SCOPES: tuple[Scope, ...] = get_args(Scope)
MEMORY_BUDGETS: dict[AcPolicy, float] = {"budget_0.5": 0.5, "budget_0.25": 0.25}
"""``ac.policy`` values that set compile's activation memory budget, and the budget each sets."""
UNIT_SCOPES: tuple[Scope, ...] = ("module", "regional")
"""Scopes that compile the model's units and leave the optimizer step to its own knobs."""
SIDE_BY_SIDE: Method = "side_by_side"
FRESH_PROCESSES: Method = "fresh_processes"


def compiles(scope: str | None) -> bool:
    """Whether a program of this ``compile.scope`` compiles anything (None, a record without it: eager)."""
    return scope not in (None, "none")


def values(choice: object) -> tuple[str, ...]:
    """The values of one of the ``Literal`` types above, in declaration order."""
    return get_args(choice)
