"""What was actually compiled: every graph a backend received, which weights it covers, and a
fingerprint of the program.

``torch.compile`` gets a :class:`Recorder` as its backend: it notes each captured graph (its role,
the parameters it takes) and hands it on unchanged to the real backend (inductor through torch's
own wrapper, so mode and options apply exactly as ``torch.compile(mode=...)`` would), so the timed
program is the configured one. One recorder per role is shared by every unit of that role: blocks
of one class then reuse one graph, as they do under plain ``torch.compile``.

The fingerprint is the set of graphs the backend compiled at the level where code is generated:
inductor's FX-graph cache keys (they hash the post-autograd aten graph, its inputs and every
inductor setting), the aten graphs under ``aot_eager``, the dynamo graphs under ``eager``. Two
configurations with one fingerprint ran the same program: ``.to()`` before or after compile, or
autocast inside or outside, can be shown to change nothing on the user's own model.

Torch only: the worker runs this where nothing else is installed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch
from torch import nn

from autocompile.config.choices import KnobValue
from autocompile.config.torch_private import LOGGERS, aot_eager_parts, counters, inductor, memory_budget
from autocompile.config.torch_private import backend as lookup_backend

Options = dict[str, str | int | bool | Callable[..., Any]]
"""``torch.compile(options=...)``: inductor settings by name (the type ``torch.compile`` declares)."""
MODEL_ROLES = ("model", "train_step")
"""Roles whose graphs run the model's forward: they count towards its compiled coverage."""


class Program(TypedDict):
    """What the warm-up compiled (:func:`verify`, and the script meter's check): the trial's ``compiled_coverage``
    and ``fingerprint``, and the ``compiled`` progress event."""

    coverage: float
    """Share of the model's weights inside graphs that ran compiled (0.0: eager)."""
    fingerprint: str
    """:meth:`CompileLog.fingerprint`, or ``eager:...`` naming what shapes an eager program."""


@dataclass
class Graph:
    role: str
    param_ids: frozenset[int]
    digest: str
    """The dynamo graph's code and input shapes."""
    training: bool = True
    """Traced with grad enabled; False: an evaluation's graph (``no_grad``), which no training step runs."""


@dataclass
class CompileLog:
    """Every graph one step compiled, and inductor's cache keys (hits and misses) while :func:`listening`."""

    graphs: list[Graph] = field(default_factory=list)
    aten: list[str] = field(default_factory=list)
    """Digests of post-autograd graphs, where the backend exposes them (``aot_eager``)."""
    inductor_keys: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    """Calls into each unit's compiled forward, by unit name (units whose entry is counted)."""
    evaluation: list[str] = field(default_factory=list)
    """The aten digests and inductor keys of evaluation graphs (compiled under ``no_grad``), also in the lists
    above: a script's evaluation before its first step compiles them, beside other candidates it may not."""
    in_evaluation: bool = False
    """While a backend compiles an evaluation graph: what it notes is the evaluation's."""

    def record(self, role: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        ids = {id(t) for t in example_inputs if isinstance(t, nn.Parameter)}
        ids |= {id(p) for p in gm.parameters()}  # graphs that keep weights as attributes
        self.graphs.append(Graph(role, frozenset(ids), _digest(gm), torch.is_grad_enabled()))

    def note(self, into: list[str], item: str) -> None:
        """An aten digest or inductor key, marked as an evaluation's while one compiles."""
        into.append(item)
        if self.in_evaluation:
            self.evaluation.append(item)

    def counted(self, name: str, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled`` with its calls counted: a unit whose compiled forward is never entered (a
        wrapper bypassed it) ran eager even if a sibling's identical graph exists."""
        self.calls[name] = 0

        def forward(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return compiled(*args, **kwargs)

        return forward

    def model_param_ids(self) -> frozenset[int]:
        """The ids of the weights the model's graphs took (``model`` and ``train_step`` roles)."""
        return frozenset().union(*(g.param_ids for g in self.graphs if g.role in MODEL_ROLES))

    def roles(self) -> set[str]:
        return {g.role for g in self.graphs}

    def fingerprint(self, extra: dict[str, KnobValue], training_only: bool = False) -> str:
        """One hash of what was compiled, plus ``extra``: what shapes the eager rest of the step.
        ``training_only``: the graphs a training step runs, an evaluation's left out (a script's windows time
        its training; whether its evaluation compiled before them depends on who else shares the process)."""
        bypassed = _counter("inductor", "fxgraph_cache_bypass")
        left_out = set(self.evaluation) if training_only else set()
        graphs = [g for g in self.graphs if g.training or not training_only]
        parts = {
            "inductor": sorted(set(self.inductor_keys) - left_out),
            "aten": sorted(set(self.aten) - left_out),
            # Graphs inductor compiled without a key, or any graph of a backend without a lower level.
            "dynamo": sorted({g.digest for g in graphs}) if (bypassed or not (self.inductor_keys or self.aten))
            else [],
            "extra": extra,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class _KeyListener(logging.Handler):
    """Collects the key each ``fx graph cache hit/miss for key %s`` line of inductor names."""

    def __init__(self, log: CompileLog) -> None:
        super().__init__(logging.DEBUG)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("fx graph cache") and record.args:
            self.log.note(self.log.inductor_keys, str(record.args[0]))  # type: ignore[index]


CODECACHE = LOGGERS["codecache"]
"""The logger inductor names each graph's FX-graph cache key on."""


@contextmanager
def listening(log: CompileLog) -> Iterator[CompileLog]:
    """Inductor's cache keys into ``log`` while the block runs; the codecache logger's level, propagate flag
    and handlers as they were afterwards (importing autocompile leaves logging alone).

    Wrap the calls that compile: compilation is lazy, so the warm-up steps, not ``apply``. A process that
    builds several steps one after another (side by side) wraps each one's warm-up with its own log, so
    every key is attributed to the step that compiled it. Inductor names each key in one log line (INFO in
    recent torch, DEBUG in older): listening costs nothing at run time and works with a warm cache (hits
    are named too), unlike listing the cache directory."""
    codecache = logging.getLogger(CODECACHE)
    level, propagate = codecache.level, codecache.propagate
    listener = _KeyListener(log)
    codecache.addHandler(listener)
    if codecache.getEffectiveLevel() > logging.DEBUG:
        codecache.setLevel(logging.DEBUG)
        codecache.propagate = False  # keep its other lines out of the trial's log
    try:
        yield log
    finally:
        codecache.removeHandler(listener)
        codecache.setLevel(level)
        codecache.propagate = propagate


def _counter(group: str, name: str) -> int:
    return int(counters()[group][name])


def _digest(gm: torch.fx.GraphModule) -> str:
    shapes = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val", node.meta.get("example_value"))
            shapes.append(repr((tuple(val.shape), val.dtype, val.stride())) if isinstance(val, torch.Tensor) else "")
    return hashlib.sha256((gm.code + "|".join(shapes)).encode()).hexdigest()[:16]


class Recorder:
    """A ``torch.compile`` backend that records each graph and hands it to the real backend."""

    def __init__(self, log: CompileLog, role: str, backend: str, mode: str | None = None,
                 options: Options | None = None, dynamic: bool | None = None,
                 memory_budget: float | None = None) -> None:
        self.log, self.role = log, role
        self.memory_budget = memory_budget
        """``ac.policy=budget_*``: AOTAutograd's partitioner keeps this share of the activations (set while this
        backend compiles, so it reaches only its own graphs, recompiles included)."""
        self.compiler_name = backend  # what dynamo's repro tooling names the backend
        self.inner: Callable[..., Any]
        if backend == "inductor":
            self.inner = inductor(mode, options, dynamic)
        elif backend == "aot_eager":
            self.inner = _recording_aot_eager(log)
        else:
            self.inner = lookup_backend(backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        self.log.record(self.role, gm, example_inputs)
        # Its lower levels compile inside this call (a training graph's backward may compile later: no grad
        # mode tells them apart, so only what an evaluation's call notes is marked).
        self.log.in_evaluation = not torch.is_grad_enabled()
        try:
            if self.memory_budget is None:
                return self.inner(gm, example_inputs, **kwargs)
            with memory_budget(self.memory_budget):
                return self.inner(gm, example_inputs, **kwargs)
        finally:
            self.log.in_evaluation = False

    # Inductor's wrapper answers these (its config for dynamo, CUDA-graph trees to reset).
    def get_compiler_config(self) -> Any:
        getter = getattr(self.inner, "get_compiler_config", None)
        return getter() if getter else None

    def reset(self) -> None:
        if hasattr(self.inner, "reset"):
            self.inner.reset()


def _recording_aot_eager(log: CompileLog) -> Callable[..., Any]:
    """``aot_eager`` exactly as torch defines it, with compilers that note each aten graph."""
    aot_autograd, boxed_nop, min_cut_rematerialization_partition = aot_eager_parts()

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            log.note(log.aten, f"{kind}:{_digest(gm)}")
            return boxed_nop(gm, example_inputs)

        return compile_graph

    return aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"),
                        partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)


def _signature(unit: nn.Module) -> tuple:
    """Units that dynamo serves from one cached graph: same class, same parameter shapes."""
    return type(unit), tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in unit.named_parameters())


@dataclass
class Coverage:
    fraction: float
    """Share of the model's parameters (by count of weights) inside graphs that ran compiled."""
    missing: list[str]
    """Units handed to ``torch.compile`` whose weights are in no graph: they ran eager."""


def sharded_aliases(model: nn.Module) -> dict[int, int]:
    """FSDP2 runs a sharded module's forward with unsharded parameters (``nn.Parameter``s it all-gathers into
    before the forward and frees after), so the graphs hold those, not the sharded DTensors that
    ``model.parameters()`` returns between steps: each unsharded parameter's id -> its sharded one's, matched
    by name while each FSDP module is unsharded (``FSDPModule.unshard``). A collective: every rank calls it.
    FSDP2 keeps one unsharded parameter object per parameter for the whole run, so the ids hold."""
    from torch.distributed.fsdp import FSDPModule

    sharded = dict(model.named_parameters(remove_duplicate=False))
    aliases: dict[int, int] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            for name, p in module.named_parameters(prefix=prefix, remove_duplicate=False):
                if name in sharded and p is not sharded[name]:
                    aliases[id(p)] = id(sharded[name])
            module.reshard()
    return aliases


def coverage(log: CompileLog, weights: list[torch.Tensor], units: list[tuple[str, nn.Module]],
             aliases: dict[int, int] | None = None) -> Coverage:
    """Which of ``weights`` (a model's parameters; a script's, every stepped optimizer's too) ran inside compiled
    graphs; ``aliases`` maps the parameters graphs took to the model's own (FSDP2's unsharded copies,
    :func:`sharded_aliases`).

    A block that reuses the graph another block of its class compiled is not handed to the backend
    again: it counts as compiled when its compiled forward was entered and an equivalent unit's
    weights are in a graph (a guard that failed for it would have compiled, and recorded, a graph
    of its own)."""
    seen = log.model_param_ids()
    seen |= {aliases[i] for i in seen if i in (aliases or {})}
    direct = {_signature(u) for _, u in units if any(id(p) in seen for p in u.parameters())}
    covered = set(seen)
    missing = []
    for name, unit in units:
        params = list(unit.parameters())
        if not params:
            continue
        entered = log.calls.get(name, 1) > 0
        if entered and (any(id(p) in seen for p in params) or _signature(unit) in direct):
            covered |= {id(p) for p in params}
        else:
            missing.append(name)
    unique = list({id(p): p for p in weights}.values())
    total = sum(p.numel() for p in unique)
    inside = sum(p.numel() for p in unique if id(p) in covered)
    return Coverage(inside / total if total else 0.0, missing)


def stepped_coverage(log: CompileLog, params: list[torch.Tensor]) -> float:
    """The share of ``params`` (the weights a script's optimizer steps) that entered compiled graphs: a script
    that compiles a function hands no module, so what its graphs train is read from what they took."""
    seen = log.model_param_ids()
    total = sum(p.numel() for p in params)
    return sum(p.numel() for p in params if id(p) in seen) / total if total else 0.0


class NothingCompiled(RuntimeError):
    """Everything handed to ``torch.compile`` ran eager: the trial would time eager code under a compiled name."""


class PartiallyCompiled(RuntimeError):
    """Some units handed to ``torch.compile`` ran eager: the trial would time another program."""


def verify(step: Any, model: nn.Module, scope: str) -> Program:
    """After warm-up: every unit handed to ``torch.compile`` ran inside a graph and every other compiled
    part (optimizer, compiled autograd) produced one, or raise naming what did not. Returns the share
    of weights compiled and the program's fingerprint. ``step`` is a ``step.TrainStep``."""
    if not step.compiled:
        return {"coverage": 0.0,
                "fingerprint": "eager:" + "|".join(f"{k}={v}" for k, v in sorted(step.eager_parts.items()))}
    sharded = step.eager_parts.get("parallel.strategy") == "fsdp2"
    cover = coverage(step.log, list(model.parameters()), step.units, sharded_aliases(model) if sharded else None)
    missing = cover.missing + sorted(step.roles - step.log.roles())
    if not step.log.graphs or len(missing) == len(step.units) + len(step.roles):
        raise NothingCompiled(f"{', '.join(step.compiled)} handed to torch.compile, but no graph was compiled "
                              "(dynamo skipped every frame)")
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise PartiallyCompiled(f"{shown} handed to torch.compile but ran eager (no graph took its weights)")
    return {"coverage": cover.fraction, "fingerprint": step.log.fingerprint({**step.eager_parts, "scope": scope})}
