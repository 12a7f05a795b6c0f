"""The agent inside each process of the user's own script: it takes over the script's ``torch.compile``.

Started by the ``sitecustomize.py`` a script trial puts first on ``PYTHONPATH`` (:mod:`autocompile.config.script`),
before the script's first line and only in the processes that run the script (not torchrun's agent, not
inductor's compile workers). :func:`boot` patches ``torch.compile`` and ``nn.Module.compile`` (torch is imported
here, so ``from torch import compile`` in the script gets the patched one) to apply the trial's compile knobs
to what the script hands them:

- ``compile.scope=none``: the module comes back unchanged (the eager baseline);
- ``module``: the module's forward compiled in place with the trial's mode, options, dynamic and fullgraph (a
  ``DistributedDataParallel`` is compiled as a wrapper, the order the script chose);
- ``regional``: each repeated block compiled in place (``autocompile.workload.units``), and the rest as
  ``compile.rest`` says.

A plain function compiled by the script cannot be given a module scope: the call fails the trial with that
reason. Calls from libraries and from torch itself on functions pass through untouched. The
:class:`~autocompile.trial.script_meter.Meter` counts and times the optimizer steps and ends the processes.

Torch only: this runs inside the user's processes, where only PyTorch may be installed.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

BOOT = time.time()

import torch  # noqa: E402
from torch import nn  # noqa: E402

from autocompile.config.knobs import TrialConfig  # noqa: E402
from autocompile.config.script import TRIAL_VAR, ScriptSpec, script_env  # noqa: E402
from autocompile.trial.apply_parts import Compilers, apply_optimize_ddp, compile_targets, compile_units  # noqa: E402
from autocompile.trial.programs import CompileLog  # noqa: E402
from autocompile.trial.script_meter import CannotTakeOver, Meter  # noqa: E402
from autocompile.trial.step import compile_kwargs  # noqa: E402

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
    global _AGENT
    trial_dir = Path(os.environ[TRIAL_VAR])
    spec = ScriptSpec.read(trial_dir)
    if not sys.argv or Path(sys.argv[0]).resolve() != Path(spec.script.path).resolve():
        return  # torchrun's own process, a compile worker, a subprocess of the script: not the script
    _AGENT = Agent(spec, trial_dir)
    _AGENT.install()


class Agent:
    """The trial's configuration, applied to what the script compiles; the meter that times its steps."""

    def __init__(self, spec: ScriptSpec, trial_dir: Path) -> None:
        self.spec = spec
        self.setup(spec.knobs, spec.device)
        self.meter: Meter | Watched = Meter(spec, trial_dir, self, BOOT)

    def setup(self, knobs: dict[str, Any], device: str) -> None:
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.config = TrialConfig.from_flat(knobs, script_env(device, self.world_size))
        self.log = CompileLog()
        self.compile_model = Compilers(self.log, compile_kwargs(self.config.compile))("model")
        self.units: list[tuple[str, nn.Module]] = []
        self.compiled: list[str] = []
        self.calls: list[dict[str, Any]] = []
        """Every ``torch.compile`` call of the script: what it compiled, from where, with which arguments."""

    @property
    def scope(self) -> str:
        return self.config.compile.scope

    def install(self) -> None:
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # a hit limit would run the rest eager, silently
        apply_optimize_ddp(self.config.ddp, self.world_size > 1)  # before the script builds DDP: read in __init__
        # Skipped CUDA graphs are read from inductor's counter, not triton.cudagraph_or_error: it is part of the
        # FX-graph cache key, and the winner's artifacts would miss in the user's own process.
        torch.compile = _compile  # type: ignore[assignment]
        nn.Module.compile = _module_compile  # type: ignore[method-assign]
        self.meter.install()

    def take_over(self, target: Any, kwargs: dict[str, Any], where: str, in_place: bool) -> Any:
        """What ``torch.compile(target, **kwargs)`` (``in_place``: ``target.compile(**kwargs)``) becomes."""
        name = getattr(target, "__qualname__", type(target).__qualname__)
        self.calls.append({"target": name, "module": isinstance(target, nn.Module), "where": where,
                           "kwargs": {k: repr(v) for k, v in kwargs.items()}})
        if not isinstance(target, nn.Module):
            if self.scope == "none":
                return target  # the eager baseline runs the function as it is
            raise CannotTakeOver(
                f"the script compiles the function {name} ({where}): compile.scope={self.scope} compiles a model, "
                "not a function; hand torch.compile the model (model = torch.compile(model)), or use "
                "autocompile.apply for the whole train step")
        if kwargs.get("disable"):
            return target
        if self.taken(target):  # prepare() took it over already, then the script's own torch.compile
            return target
        runner = target
        if self.scope != "none":
            runner = self._compile(target, in_place)
        self.meter.watch(runner, target)
        return target if in_place else runner

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
        self.units += targets
        return module


class Watched:
    """What a run of the winner keeps of the meter: the models the script handed over (nothing is timed)."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []

    def watch(self, runner: nn.Module, model: nn.Module) -> None:
        self.models.append(model)

    def install(self) -> None:
        pass


class WinnerAgent(Agent):
    """The winner's knobs applied to the script's ``torch.compile`` calls (and its ``prepare``) exactly as its
    trial applied them, in the user's own run: no timing, no early end, no recompile-limit failure."""

    def __init__(self, knobs: dict[str, Any]) -> None:
        self.spec = None  # type: ignore[assignment]
        self.setup(knobs, "cuda" if torch.cuda.is_available() else "cpu")
        self.meter = Watched()

    def install(self) -> None:
        apply_optimize_ddp(self.config.ddp, self.world_size > 1)
        torch.compile = _compile  # type: ignore[assignment]
        nn.Module.compile = _module_compile  # type: ignore[method-assign]


def run_winner(script: str, argv: list[str], knobs: dict[str, Any]) -> None:
    """Run ``script`` with ``argv`` as ``python script ...`` would, its compile taken over by ``knobs`` (a
    study's winner): what ``best_config.py`` of a script study calls, in each process torchrun starts."""
    global _AGENT
    _AGENT = WinnerAgent(knobs)
    _AGENT.install()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python puts the script's folder first
    runpy.run_path(script, run_name="__main__")


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


def agent() -> Agent | None:
    """The agent of this process, when it runs a script trial."""
    return _AGENT
