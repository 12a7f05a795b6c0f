"""Several candidates of a script in one of its processes: each unit the agent takes over gets one compiled
variant per candidate, and its ``forward`` becomes a :class:`Switch` that runs the active candidate's.

Each variant is its own ``torch.compile`` call with its own backend object (a :class:`Recorder` per candidate),
so dynamo keeps a cache entry per candidate on the unit's one code object, and each candidate's graphs land in
its own :class:`CompileLog` (its coverage and fingerprint, checked against its cold run alone). ``compile.scope
=none`` is the unit's own forward. Only knobs that change what the script's modules run compiled vary here (mode,
options, dynamic, fullgraph, backend, scope: none, the model whole, its blocks): which knobs may, and why the
others may not, is :func:`autocompile.study.phases.sidebyside.script_cannot_share`.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from autocompile.config.choices import Knobs, compiles
from autocompile.config.knob_spec import Env
from autocompile.config.knobs import TrialConfig
from autocompile.config.script_settings import ScriptRotation
from autocompile.trial.program.apply_parts import Compilers, compile_targets, compile_units
from autocompile.trial.program.graphs import (
    CompileLog,
    NothingCompiled,
    PartiallyCompiled,
    Program,
    coverage,
    stepped_coverage,
)
from autocompile.trial.program.step import compile_kwargs
from autocompile.trial.script import hooks
from autocompile.trial.script.ending import CannotTakeOver

log = logging.getLogger("autocompile.trial.script")


class Variant:
    """One candidate's compile of what the script hands over: its configuration, log, units and names."""

    def __init__(self, label: str, config: TrialConfig) -> None:
        self.label, self.config = label, config
        self.log = CompileLog()
        self.compile_model = Compilers(self.log, compile_kwargs(config.compile))("model")
        self.units: list[tuple[str, nn.Module]] = []
        self.compiled: list[str] = []

    @property
    def scope(self) -> str:
        return self.config.compile.scope


class Switch:
    """A unit's ``forward`` that runs the active candidate's variant (left out when the unit is pickled)."""

    __slots__ = ("forwards", "variants")

    def __init__(self, forwards: list[Any], variants: Variants) -> None:
        self.forwards, self.variants = forwards, variants

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forwards[self.variants.active](*args, **kwargs)


class Variants:
    """Every candidate's variant of the units, and which one runs now."""

    def __init__(self, rotation: ScriptRotation, env: Env) -> None:
        self.all = [Variant(label, TrialConfig.from_flat(knobs, env))
                    for label, knobs in zip(rotation.labels, rotation.knobs, strict=True)]
        self.active = 0

    @property
    def compiles_anything(self) -> bool:
        return any(compiles(v.scope) for v in self.all)

    def take_over(self, module: nn.Module, prefix: str) -> None:
        """Compile ``module``'s units once per compiled candidate, each unit's forward a :class:`Switch`.

        Candidates may compile different units (the model whole against its blocks): every unit any of them
        compiles gets a Switch, which runs the unit's own forward for a candidate that does not compile it. A
        model compiled whole traces through its blocks' Switches while it is active (dynamo guards on which
        candidate is), so it inlines their own forwards; with the blocks' candidate active the model's forward is
        its own and each block runs compiled. The fingerprint check against each candidate's cold run alone
        says whether that holds."""
        compiled = [v for v in self.all if compiles(v.scope)]
        if not compiled:
            return
        targets: dict[str, list[str]] = {}
        units: dict[str, nn.Module] = {}
        for v in compiled:
            try:
                found = compile_targets(module, v.config.compile)
            except ValueError as exc:  # regional on a model without repeated blocks
                raise CannotTakeOver(f"compile.scope={v.scope} on {type(module).__name__}: {exc}") from exc
            targets[v.label] = [name for name, _ in found]
            units.update(found)
        for name, unit in units.items():  # each unit compiled before its own Switch: never a Switch compiled
            own = unit.__dict__.get("forward")
            plain = unit.forward
            forwards = []
            for v in self.all:
                if name not in targets.get(v.label, []):
                    forwards.append(plain)  # eager, or a unit this candidate leaves to another's compile
                    continue
                compile_units([(f"{prefix}{name}", unit)], v.compile_model, v.log)
                forwards.append(unit.__dict__["forward"])
                if own is None:  # back to the class's forward for the next candidate's compile
                    del unit.__dict__["forward"]
                else:
                    unit.forward = own  # type: ignore[method-assign]
            unit.forward = Switch(forwards, self)  # type: ignore[method-assign]
        for v in compiled:  # in each candidate's own order, as its process alone names them
            v.units += [(f"{prefix}{name}", units[name]) for name in targets[v.label]]
            v.compiled += [f"{prefix}{name}" for name in targets[v.label]]
        hooks.leave_out_forward(list(units.values()))

    def program(self, i: int, models: list[nn.Module], weights: list[torch.Tensor], calls: int,
                prepared: Knobs) -> Program:
        """Candidate ``i``'s coverage and fingerprint after its warm-up, as its own process reports them."""
        v = self.all[i]
        return script_program(v.log, v.scope, v.units, v.compiled, [], models, weights, calls, prepared)


def script_program(log: CompileLog, scope: str, units: list[tuple[str, nn.Module]], compiled: list[str],
                   functions: list[str], models: list[nn.Module], weights: list[torch.Tensor], calls: int,
                   prepared: Knobs) -> Program:
    """After the warm-up: what the script's trial compiled ran compiled (every unit inside a graph), or raise
    why not. Its coverage counts ``weights`` (the models' and every stepped optimizer's): a module the script
    trains and nobody compiled ran eager, and shows there. ``functions``: functions compiled, no module."""
    if not compiles(scope):
        return {"coverage": 0.0, "fingerprint": "eager:script" + "".join(
            f":{k}={val}" for k, val in sorted(prepared.items()))}
    dynamo_skipped = NothingCompiled(f"{', '.join(compiled)} handed to torch.compile, but no graph was compiled "
                                     "(dynamo skipped every frame)")
    if functions and not models:  # only functions compiled: their graphs hold what they train
        if not log.graphs:
            raise dynamo_skipped
        return {"coverage": stepped_coverage(log, weights),
                "fingerprint": log.fingerprint({"scope": "function", "script": True, **prepared}, training_only=True)}
    if not calls or not models:
        raise NothingCompiled(f"compile.scope={scope}, but the script never called torch.compile on a model, and no "
                              "module it calls owns its optimizer's parameters or got gradients from its backward() "
                              "(nothing to take over): add model = torch.compile(model) to it")
    cover = coverage(log, [p for m in models for p in m.parameters()] + weights, units)
    if not log.graphs:
        raise dynamo_skipped
    if cover.missing:
        raise PartiallyCompiled(f"{', '.join(cover.missing[:6])} handed to torch.compile but ran eager")
    return {"coverage": cover.fraction,
            "fingerprint": log.fingerprint({"scope": scope, "script": True, **prepared}, training_only=True)}
