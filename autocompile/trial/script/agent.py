"""The agent inside each process of the user's own script: it takes over the script's ``torch.compile``.

Started by the ``sitecustomize.py`` a script trial puts first on ``PYTHONPATH``
(:mod:`autocompile.config.script_settings`),
before the script's first line and only in the processes that run the script (not torchrun's agent, not
inductor's compile workers). :func:`boot` patches ``torch.compile`` and ``nn.Module.compile`` (torch is imported
here, so ``from torch import compile`` in the script gets the patched one) to apply the trial's compile knobs
to what the script hands them:

- ``compile.scope=none``: the module comes back unchanged (the eager baseline);
- ``module``: the module's forward compiled in place with the trial's mode, options, dynamic and fullgraph (a
  ``DistributedDataParallel`` is compiled as a wrapper, the order the script chose);
- ``regional``: each repeated block compiled in place (``autocompile.workload.units``), and the rest as
  ``compile.rest`` says.

A script that calls no ``torch.compile`` before its first optimizer step has its models found: the module it calls
(outside any other) that owns each optimizer's parameters (a GAN's two), taken over in place at that step as if the
script had compiled it, so its later steps run the trial's program (and ``best_config.py`` applies the winner the
same way); with no optimizer (an update by hand), the module whose weights its first ``backward()`` filled.
A function the script compiles (``torch.compile(fn)``, a decorator) is compiled whole with the trial's knobs
under any compiled scope (eager under ``none``): it is its own region. Calls from libraries and from torch itself
on functions pass through untouched. The
:class:`~autocompile.trial.script.meter.Meter` counts and times the optimizer steps and ends the processes.

Torch only: this runs inside the user's processes, where only PyTorch may be installed.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Protocol

BOOT = time.time()

import torch  # noqa: E402
from torch import nn  # noqa: E402

from autocompile.config.choices import Knobs, compiles  # noqa: E402
from autocompile.config.knobs import TrialConfig  # noqa: E402
from autocompile.config.script_settings import TRIAL_VAR, ScriptSpec, calls_prepare, script_env  # noqa: E402
from autocompile.config.torch_private import dynamo_config, set_compiled_call  # noqa: E402
from autocompile.trial.program.apply_parts import (  # noqa: E402
    Compilers,
    apply_ac,
    apply_optimize_ddp,
    compile_targets,
    compile_units,
    compiles_ddp,
)
from autocompile.trial.program.graphs import CompileLog  # noqa: E402
from autocompile.trial.program.step import compile_kwargs  # noqa: E402
from autocompile.trial.script import hooks  # noqa: E402
from autocompile.trial.script.ending import CannotTakeOver, CompileCall, Prepared  # noqa: E402
from autocompile.trial.script.finding import ModelFinder  # noqa: E402
from autocompile.trial.script.meter import Meter  # noqa: E402
from autocompile.trial.script.variants import Variants  # noqa: E402
from autocompile.trial.timing.readings import RecompileLimitHits  # noqa: E402
from autocompile.workload.optim import set_impl  # noqa: E402

_REAL_COMPILE = torch.compile
_REAL_MODULE_COMPILE = nn.Module.compile
_AGENT: Agent | None = None
_PASS_THROUGH = tuple(str(Path(p).resolve()) for p in (
    os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))))
"""Code that calls ``torch.compile`` for its own ends (torch, autocompile, the standard library, installed
packages): its calls on functions reach the real ``torch.compile``."""


def boot() -> None:
    """Start the agent in this process when it runs the trial's script (``sitecustomize`` calls this)."""
    trial_dir = Path(os.environ[TRIAL_VAR])
    spec = ScriptSpec.read(trial_dir)
    if not sys.argv or Path(sys.argv[0]).resolve() != Path(spec.script.path).resolve():
        return  # torchrun's own process, a compile worker, a subprocess of the script: not the script
    if spec.script.seed is not None:
        seed(spec.script.seed)
    activate(Agent(spec, trial_dir))


def seed(value: int) -> None:
    """What ``script.seed`` seeds, before the script's first line: torch (every device), ``random`` and numpy."""
    import random

    random.seed(value)
    torch.manual_seed(value)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(value)


def patch_compile() -> None:
    """``torch.compile`` and ``nn.Module.compile`` reach this process's agent (the script's calls; others pass)."""
    torch.compile = _compile  # type: ignore[assignment]
    nn.Module.compile = _module_compile  # type: ignore[method-assign]


def activate(agent: Agent) -> None:
    """Make ``agent`` this process's agent (the script's ``torch.compile`` calls reach it) and install it."""
    global _AGENT
    _AGENT = agent
    agent.install()


class Watches(Protocol):
    """What the agent hands what the script compiles to: the trial's meter, or a winner's run (nothing timed)."""

    models: list[nn.Module]

    def watch(self, runner: nn.Module, model: nn.Module) -> None: ...

    def install(self) -> None: ...


class Agent:
    """The trial's configuration, applied to what the script compiles; the meter that times its steps."""

    def __init__(self, spec: ScriptSpec, trial_dir: Path) -> None:
        self.spec = spec
        prepares = calls_prepare(spec.script.path)
        self.setup(spec.knobs, spec.device, prepares)
        if spec.rotation is not None:
            from autocompile.trial.script.rotation import RotationMeter

            self.variants = Variants(spec.rotation, script_env(spec.device, self.world_size, prepares))
            self.meter: Watches = RotationMeter(spec, trial_dir, self, BOOT)
        else:
            self.meter = Meter(spec, trial_dir, self, BOOT)

    def setup(self, knobs: Knobs, device: str, prepares: bool, strict: bool = True) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.config = TrialConfig.from_flat(knobs, script_env(device, self.world_size, prepares), strict=strict)
        self.log = CompileLog()
        self.compile_model = Compilers(self.log, compile_kwargs(self.config.compile))("model")
        self.units: list[tuple[str, nn.Module]] = []
        self.compiled: list[str] = []
        self.functions: list[str] = []
        """The functions the script compiled, taken over with the trial's knobs (:meth:`_compile_function`)."""
        self.calls: list[CompileCall] = []
        """Every ``torch.compile`` call of the script: what it compiled, from where, with which arguments."""
        self.prepared: Prepared = {}
        """What ``autocompile.prepare`` applied, read back from the script's objects (empty: never called)."""
        self.awaiting_ddp: nn.Module | None = None
        """``ddp.wrap_order=compile_of_ddp``: the prepared model, compiled once the script wraps it in DDP."""
        self.finder: ModelFinder | None = None
        """Until the script's first ``torch.compile`` call or optimizer step: the modules it calls."""
        self.variants: Variants | None = None
        """Side by side (``spec.rotation``): every candidate's variant of what the script compiles."""

    @property
    def scope(self) -> str:
        return self.config.compile.scope

    def install(self) -> None:
        # Alone, as under plain torch, calls past the recompile limit run eager, and the result lists each hit (the
        # user's job would live with them); side by side, one candidate's would run eager beside the others.
        config = dynamo_config()
        config.fail_on_recompile_limit_hit = self.variants is not None
        self.limit_hits = RecompileLimitHits().install()
        if self.variants is not None:  # each candidate a cache entry per code object: each its own budget
            n = len(self.variants.all)
            config.recompile_limit, config.accumulated_recompile_limit = (
                config.recompile_limit * n, config.accumulated_recompile_limit * n)
        apply_optimize_ddp(self.config.ddp, self.world_size > 1)  # before the script builds DDP: read in __init__
        # Skipped CUDA graphs are read from inductor's counter, not triton.cudagraph_or_error: it is part of the
        # FX-graph cache key, and the winner's artifacts would miss in the user's own process.
        patch_compile()
        # Eager too: its items are then counted from the same model's forwards as a compiled trial's (one unit for
        # every trial of a study), and its model's structure is known (what the reference run tells the space).
        self.find_model()
        self.meter.install()

    def find_model(self) -> None:
        """Find the models of a script that calls no ``torch.compile`` (:mod:`~autocompile.trial.script.finding`)."""
        self.finder = ModelFinder(self.model_found)

    def stop_finding(self) -> None:
        """Nothing to find: no global module hook may stay where dynamo traces the script's model."""
        if self.finder is not None:
            self.finder.stop()
            self.finder = None

    def model_found(self, found: list[tuple[nn.Module, str]]) -> None:
        if self.calls:
            return  # the script compiles for itself (taken over at its call)
        for model, where in found:
            if self.compiles_anything:
                self.take_over(model, {}, where, in_place=True)
            elif not self.taken(model):  # eager: watched as a compiled trial watches it, no compile call recorded
                self.meter.watch(model, model)

    def take_over(self, target: Any, kwargs: dict[str, Any], where: str, in_place: bool) -> Any:
        """What ``torch.compile(target, **kwargs)`` (``in_place``: ``target.compile(**kwargs)``) becomes."""
        self.stop_finding()
        name = getattr(target, "__qualname__", type(target).__qualname__)
        self.calls.append({"target": name, "module": isinstance(target, nn.Module), "where": where,
                           "kwargs": {k: repr(v) for k, v in kwargs.items()}})
        if not isinstance(target, nn.Module):
            return self._compile_function(target, name, kwargs, where)
        if kwargs.get("disable"):
            return target
        if self.taken(target):  # prepare() took it over already, then the script's own torch.compile
            return target
        runner = target
        if self.variants is not None:
            self._compile_variants(target, in_place)
        elif compiles(self.scope):
            runner = self._compile(target, in_place)
        self.meter.watch(runner, target)
        return target if in_place else runner

    def prepare(self, model: nn.Module, optimizer: Any, where: str) -> None:
        """``autocompile.prepare(model, optimizer)`` in a trial: checkpointing per block, the optimizer's
        implementation (on the script's own optimizer object: its scheduler holds it), then the compile scope
        in place, as the tuner's own trials order them. Under ``compile_of_ddp`` the model is compiled when the
        script wraps it in DDP (``DistributedDataParallel`` then compiles itself in place)."""
        self.stop_finding()
        config = self.config
        if config.optim.impl != "default":
            if optimizer is None:
                raise CannotTakeOver(f"optim.impl={config.optim.impl}: pass the optimizer too, "
                                     f"autocompile.prepare(model, optimizer) ({where})")
            try:
                set_impl(optimizer, config.optim.impl)
            except (ValueError, RuntimeError, TypeError) as exc:
                raise CannotTakeOver(f"optim.impl={config.optim.impl} on {type(optimizer).__name__}: {exc}") from exc
        inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        try:
            checkpointed = apply_ac(inner, config.ac)
        except ValueError as exc:  # no repeated blocks: nothing to checkpoint, the trial would time ac=none
            raise CannotTakeOver(f"ac.policy={config.ac.policy}: {exc}") from exc
        hooks.leave_out_forward([inner.get_submodule(name) for name in checkpointed])
        groups = optimizer.param_groups if optimizer is not None else []
        self.prepared = {"where": where, "optimizer": type(optimizer).__name__ if optimizer is not None else None,
                         "foreach": [g.get("foreach") for g in groups], "fused": [g.get("fused") for g in groups],
                         "checkpointed": checkpointed}
        if not compiles_ddp(config.ddp, self.scope, self.world_size > 1):
            self.take_over(inner, {}, where, in_place=True)  # DDP built before or after runs the compiled model
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            self.compile_ddp(model, where)
        else:
            self.awaiting_ddp = inner
            _compile_when_wrapped(self)

    def compile_ddp(self, ddp: nn.parallel.DistributedDataParallel, where: str) -> None:
        """``torch.compile(DDP(model))`` on the script's own DDP object: its call compiled in place (what
        ``Module.compile`` does), so dynamo's DDPOptimizer splits the graph at the buckets."""
        self.awaiting_ddp = None
        self.stop_finding()
        self.calls.append({"target": "DistributedDataParallel", "module": True, "where": where, "kwargs": {}})
        self.units.append(("DistributedDataParallel(model)", ddp.module))
        self.compiled.append("DistributedDataParallel(model)")
        set_compiled_call(ddp, self.compile_model(ddp._call_impl))
        self.meter.watch(ddp, ddp.module)

    def prepared_knobs(self) -> Knobs:
        """The knobs ``prepare`` applied that change the program (part of its fingerprint)."""
        c = self.config
        knobs: Knobs = {"ac.policy": c.ac.policy, "optim.impl": c.optim.impl}
        if self.world_size > 1:
            knobs["ddp.wrap_order"] = c.ddp.wrap_order
        return knobs if self.prepared else {}

    @property
    def compiles_anything(self) -> bool:
        """Whether the trial compiles anything (``compile.scope`` is not none; side by side, any candidate)."""
        return self.variants.compiles_anything if self.variants is not None else compiles(self.scope)

    def unmet(self) -> str | None:
        """Why the trial's program did not run as its configuration names (checked after warm-up), or None."""
        c = self.config
        opened: Knobs = {k: v for k, v in (("ac.policy", c.ac.policy), ("optim.impl", c.optim.impl)) if v != "none"
                  and v != "default"}
        if compiles_ddp(c.ddp, self.scope, self.world_size > 1):
            opened["ddp.wrap_order"] = c.ddp.wrap_order
        if opened and not self.prepared:
            return (f"{', '.join(f'{k}={v}' for k, v in opened.items())} needs autocompile.prepare(model, "
                    "optimizer) before training, and the script never called it")
        if self.awaiting_ddp is not None:
            return ("ddp.wrap_order=compile_of_ddp: the prepared model was never wrapped in "
                    "DistributedDataParallel; prepare it before the script wraps it")
        return None

    def taken(self, module: nn.Module) -> bool:
        inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
        return any(inner is m for m in self.meter.models)

    def _compile(self, module: nn.Module, in_place: bool) -> nn.Module:
        prefix = f"{len(self.meter.models)}:" if self.meter.models else ""
        if self.scope == "module" and isinstance(module, nn.parallel.DistributedDataParallel) and not in_place:
            # torch.compile(DDP(model)): the script's wrap order, compiled as a wrapper (dynamo's DDPOptimizer).
            self.units.append((f"{prefix}DistributedDataParallel(model)", module.module))
            self.compiled.append(f"{prefix}DistributedDataParallel(model)")
            return self.compile_model(module)
        try:
            targets = compile_targets(module, self.config.compile)
        except ValueError as exc:  # regional on a model without repeated blocks
            raise CannotTakeOver(f"compile.scope=regional on {type(module).__name__}: {exc}") from exc
        targets = [(f"{prefix}{name}", unit) for name, unit in targets]
        self.compiled += compile_units(targets, self.compile_model, self.log)
        hooks.leave_out_forward([unit for _, unit in targets])
        self.units += targets
        return module

    def _compile_function(self, fn: Any, name: str, kwargs: dict[str, Any], where: str) -> Any:
        """A function the script compiles (its train step, a loss, a decorated helper): eager under
        ``compile.scope=none``, else compiled whole with the trial's backend, mode, options, dynamic and fullgraph
        in place of the script's own arguments -- a function is its own region whatever the scope."""
        if not self.compiles_anything or kwargs.get("disable"):
            return fn
        if self.variants is not None:
            raise CannotTakeOver(f"side by side, the script's candidates share one process, but its function "
                                 f"{name} ({where}) is compiled once, where the script compiles it (fresh-process "
                                 "rounds)")
        self.functions.append(name)
        self.compiled.append(f"function {name}")
        return self.compile_model(fn)

    def _compile_variants(self, module: nn.Module, in_place: bool) -> None:
        """Side by side: every candidate's variant of ``module``'s units, switched per window (in place)."""
        assert self.variants is not None
        if isinstance(module, nn.parallel.DistributedDataParallel):
            raise CannotTakeOver("side by side, the script's candidates share one process: a DDP wrapper is "
                                 "compiled per process (fresh-process rounds)")
        self.variants.take_over(module, f"{len(self.meter.models)}:" if self.meter.models else "")


def _caller(depth: int = 2) -> tuple[str, str]:
    frame = sys._getframe(depth)
    return frame.f_code.co_filename, f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def caller_of_prepare() -> str:
    """``train.py:120``: where the script called ``autocompile.prepare`` (called by prepare itself)."""
    return _caller(3)[1]


def _ours(filename: str) -> bool:
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    return path.startswith(_PASS_THROUGH)


@functools.wraps(_REAL_COMPILE)
def _compile(model: Any = None, **kwargs: Any) -> Any:
    filename, where = _caller()
    agent = _AGENT
    if agent is None or (_ours(filename) and not isinstance(model, nn.Module)):
        return _REAL_COMPILE(model, **kwargs) if model is not None else _REAL_COMPILE(**kwargs)
    if model is None:  # @torch.compile(mode=...): the decorator takes over the function it gets
        return lambda fn: agent.take_over(fn, kwargs, where, in_place=False)
    return agent.take_over(model, kwargs, where, in_place=False)


@functools.wraps(_REAL_MODULE_COMPILE)
def _module_compile(self: nn.Module, *args: Any, **kwargs: Any) -> None:
    _, where = _caller()
    if _AGENT is None:
        return _REAL_MODULE_COMPILE(self, *args, **kwargs)
    _AGENT.take_over(self, kwargs, where, in_place=True)
    return None


_DDP_WAITING: list[Agent] = []
"""Agents whose prepared model is compiled once the script wraps it in DDP (``ddp.wrap_order=compile_of_ddp``)."""


def _compile_when_wrapped(waiting: Agent) -> None:
    """Compile ``waiting``'s prepared model's DDP wrapper as the script builds it (DDP's ``__init__`` patched once)."""
    _DDP_WAITING.append(waiting)
    ddp_class = nn.parallel.DistributedDataParallel
    if getattr(ddp_class.__init__, "_autocompile", False):
        return
    real_init = ddp_class.__init__

    @functools.wraps(real_init)
    def init(self: nn.parallel.DistributedDataParallel, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        real_init(self, module, *args, **kwargs)
        for agent in [a for a in _DDP_WAITING if a.awaiting_ddp is module]:
            _DDP_WAITING.remove(agent)
            agent.compile_ddp(self, _caller()[1])

    init._autocompile = True  # type: ignore[attr-defined]
    ddp_class.__init__ = init  # type: ignore[method-assign]


def agent() -> Agent | None:
    """The agent of this process, when it runs a script trial."""
    return _AGENT
