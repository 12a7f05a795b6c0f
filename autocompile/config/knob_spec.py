"""How a knob is declared: the environment its conditions read (:class:`Env`), a condition with its words
(:class:`Rule`), a knob's spec (:class:`KnobSpec`) and :func:`knob`, which makes a dataclass field one; then
the conditions on ``compile.scope`` that several knob groups read.

The knob groups themselves live in :mod:`autocompile.config.knobs` (and the parallel ones in
:mod:`autocompile.config.parallel_knobs`). Standard library only (torch lazily, in :meth:`Env.detect`): the
worker runs this where nothing but PyTorch is installed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autocompile.config.choices import UNIT_SCOPES, compiles

Flat = Mapping[str, Any]


@dataclass(frozen=True)
class Env:
    """What the workload and the running torch allow; knob conditions read it."""

    device: str = "cpu"
    """Device type the trial trains on: ``cpu`` or ``cuda``."""
    world_size: int = 1
    """Total number of training processes (nnodes x nproc_per_node)."""
    shapes_vary: bool = False
    """True when the data schedule uses more than one sequence length."""
    modes: tuple[str, ...] = ("default",)
    """``torch.compile`` modes worth running here (cudagraph modes only on CUDA)."""
    graph_modes: tuple[str, ...] = ()
    """Those of ``modes`` that record CUDA graphs (inductor's ``triton.cudagraphs``)."""
    nested_regions: bool = False
    """Whether ``torch.compiler.nested_compile_region`` exists in the running torch."""
    memory_budget: bool = False
    """Whether the running torch has compile's activation memory budget
    (``torch._functorch.config.activation_memory_budget``)."""
    has_blocks: bool = True
    """The model has a repeated stack of blocks (``units.Structure``; unknown counts as yes)."""
    splits_blocks: bool = True
    """Its blocks have more than one part with weights (sublayer granularity differs from block)."""
    has_rest: bool = True
    """Weights live outside the repeated stacks (``compile.rest`` can matter)."""
    same_blocks: bool = True
    """Every block has one structure: nested compile regions apply (one region reused by structurally
    identical blocks, as ``torch.compiler.nested_compile_region`` is meant for)."""
    optimizer_impls: tuple[str, ...] = ("for_loop", "foreach", "fused")
    """``optim.impl`` values besides ``default`` that the workload's optimizer takes and the device runs."""
    scheduled: bool = True
    """The workload has an LR schedule (``workload.lr_schedule``)."""
    clips: bool = True
    """The workload clips gradients (``workload.grad_clip_norm`` > 0)."""
    accumulates: bool = False
    """The workload accumulates gradients over micro-batches (``workload.grad_accum_steps`` > 1)."""
    script_mode: bool = False
    """The job is the user's own script (``script.path``): only the knobs its agent reaches apply."""
    script_prepares: bool = False
    """The script calls ``autocompile.prepare(model, optimizer)``: checkpointing, the optimizer's
    implementation and the DDP wrap order are reachable there too."""

    @classmethod
    def detect(cls, device: str, world_size: int, shapes_vary: bool, structure: Any = None,
               job: Mapping[str, Any] | None = None) -> Env:
        """``structure``: a ``units.Structure`` of the model; ``job``: ``parts.knob_facts`` of the workload.
        Without them every structural or optimizer knob value is offered."""
        import torch

        from autocompile.config.torch_private import has_memory_budget, mode_options

        graphs = {mode: bool(options.get("triton.cudagraphs", False)) for mode, options in mode_options().items()}
        # On CPU a cudagraph mode silently runs as its no-cudagraph twin: a duplicate trial.
        modes = tuple(mode for mode, graphed in graphs.items() if device == "cuda" or not graphed)
        return cls(
            device=device,
            world_size=world_size,
            shapes_vary=shapes_vary,
            modes=modes,
            graph_modes=tuple(mode for mode in modes if graphs[mode]),
            nested_regions=hasattr(torch.compiler, "nested_compile_region"),
            memory_budget=has_memory_budget(),
            **({} if structure is None else dataclasses.asdict(structure)),
            **(job or {}),
        )


@dataclass(frozen=True)
class Rule:
    """A condition on earlier knobs and the environment, with the words that explain it."""

    text: str
    test: Callable[[Flat, Env], bool]

    def __and__(self, other: Rule) -> Rule:
        return Rule(f"{self.text} and {other.text}", lambda c, e: self.test(c, e) and other.test(c, e))


Values = tuple[Any, ...] | Callable[[Flat, Env], tuple[Any, ...]]


@dataclass(frozen=True)
class KnobSpec:
    """One knob's declaration, read from its field's metadata."""

    values: Values
    """Every value it may take (or a function of the earlier knobs and the environment giving them)."""
    doc: str
    """One line on what it does, shown in ``--help`` and in error messages."""
    when: Rule | None = None
    """The condition under which it applies; None = always."""
    search: Values | None = None
    """What the tuner samples (a subset of ``values``); None = all of them."""
    extended: bool = False
    """Only sampled when the study asks for the extended space."""
    question: str = ""
    """The user question its verdict answers in the report (empty: no verdict)."""
    api: str = ""
    """The torch API the knob sets (for the reference page ``docs/reference/knobs.md``)."""

    def allowed(self, config: Flat, env: Env) -> tuple[Any, ...]:
        return self.values(config, env) if callable(self.values) else self.values

    def searched(self, config: Flat, env: Env) -> tuple[Any, ...]:
        if self.search is None:
            return self.allowed(config, env)
        search = self.search(config, env) if callable(self.search) else self.search
        return tuple(v for v in search if v in self.allowed(config, env))


def knob(default: Any, *, values: Values, doc: str, when: Rule | None = None,
         search: Values | None = None, extended: bool = False, question: str = "", api: str = "") -> Any:
    """Declare a knob: a dataclass field whose metadata the table is read from.

    ``search`` narrows what the tuner samples (default: all ``values``); ``extended`` knobs are
    only sampled when the study asks for the extended space; ``question`` is the user question the
    knob's verdict answers in the report; ``api`` the torch API behind it.
    """
    spec = KnobSpec(values=values, doc=doc, when=when, search=search, extended=extended, question=question, api=api)
    return field(default=default, metadata={"knob": spec})


COMPILED = Rule("compile.scope is not none", lambda c, e: compiles(c["compile.scope"]))
MODEL_COMPILED = Rule(
    "compile.scope is module or regional", lambda c, e: c["compile.scope"] in UNIT_SCOPES
)
REGIONAL = Rule("compile.scope is regional", lambda c, e: c["compile.scope"] == "regional")
MODULE_SCOPE = Rule("compile.scope is module", lambda c, e: c["compile.scope"] == "module")
DISTRIBUTED = Rule("world size > 1", lambda c, e: e.world_size > 1)


BOOL = (False, True)
TRISTATE = (None, True, False)
