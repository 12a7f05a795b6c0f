"""The winner as the framework exporters see it, and the parts of it a framework cannot express.

A :class:`Winner` holds the recommended configuration (its active knobs), the study's verdicts and the
facts of the job it was measured on (device, world size, workload). A :class:`Gap` is one part of the
winner that a framework's config cannot say: the winner's value, what the framework does instead, how to
get the winner's behaviour in code, and what the difference cost in the study's own measurements (a
verdict or a matched pair between exactly those two values), or "not measured".
"""

from __future__ import annotations

import importlib
import inspect
import logging
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from autocompile.config.choices import Scope, compiles
from autocompile.config.knobs import KNOBS
from autocompile.study.statistics.effect import Effect

log = logging.getLogger(__name__)

NOT_MEASURED = "not measured"


class GapDoc(TypedDict):
    """A :class:`Gap` in ``best_config.trainer.json``'s ``not_expressible`` list."""

    knob: str
    winner: Any
    instead: Any
    how: str
    cost: str
    step_change: float | None
    """Rounded to 4 places."""


class OptimizerHyper(TypedDict, total=False):
    """The hyperparameters of the study's optimizer that the exports write (those it has)."""

    lr: float
    betas: tuple[float, ...] | list[float]
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class Gap:
    """One part of the winner a framework's config file cannot express."""

    knob: str
    """The knob (dotted key) whose value the framework cannot take."""
    winner: Any
    """The winner's value."""
    instead: Any
    """What the framework does instead."""
    how: str
    """Why, and how to get the winner's behaviour in code around the framework."""
    cost: str = NOT_MEASURED
    """What ``instead`` costs against ``winner`` in the study's measurements, or "not measured"."""
    step_change: float | None = None
    """Relative change of step time going from ``winner`` to ``instead`` (positive = slower); None: not measured."""

    def as_dict(self) -> GapDoc:
        return {"knob": self.knob, "winner": self.winner, "instead": self.instead, "how": self.how,
                "cost": self.cost, "step_change": None if self.step_change is None else round(self.step_change, 4)}

    def comment(self, width: int = 110) -> list[str]:
        """The gap as comment lines (``# ...``) for YAML and TOML files."""
        text = f"{self.knob}: {self.winner!r} -> {self.instead!r}. {self.how} Cost: {self.cost}."
        return textwrap.wrap(text, width, initial_indent="# - ", subsequent_indent="#   ")


@dataclass(frozen=True)
class Winner:
    """The recommended configuration and the job it was measured on."""

    config: Mapping[str, Any]
    """The winner's active knobs (dotted keys); a knob not given is inactive and holds its default."""
    effects: Sequence[Effect] = ()
    """The study's verdicts (the verdict phase's, else the search's matched pairs): what each gap costs."""
    device: str = "cpu"
    """Device type the study trained on (``cpu`` or ``cuda``)."""
    world_size: int = 1
    """Training processes per trial."""
    nnodes: int = 1
    """Nodes per trial."""
    workload: Mapping[str, Any] = field(default_factory=dict)
    """The study's ``workload`` section (batch_size, seq_len, optimizer, grad_clip_norm, grad_accum_steps)."""
    study: str = ""
    """Study name, for the files' headers."""
    trial: int | None = None
    """The winner's trial number."""

    def knob(self, key: str, default: Any = None) -> Any:
        """The knob's value: given, else its default in the knob table, else ``default`` (a knob this
        version of the table does not have, e.g. ``parallel.strategy`` before FSDP2 knobs exist)."""
        if key in self.config:
            return self.config[key]
        return KNOBS[key][1] if key in KNOBS else default

    def active(self, key: str) -> bool:
        """Whether the knob applied to the winner (inactive knobs cannot matter, so they are no gap)."""
        return key in self.config

    @property
    def strategy(self) -> str:
        """``single`` (one process), ``ddp`` or ``fsdp2``."""
        return "single" if self.world_size <= 1 else str(self.knob("parallel.strategy", "ddp"))

    @property
    def scope(self) -> Scope:
        return cast(Scope, self.knob("compile.scope"))

    @property
    def compiled(self) -> bool:
        return compiles(self.scope)

    def header(self, framework: str) -> list[str]:
        """Comment lines every exported file opens with: what it is and where it was measured."""
        trial = f", trial {self.trial}" if self.trial is not None else ""
        return [f"# {framework} settings for the winner of autocompile study {self.study or '?'}{trial}:",
                f"# measured on {self.device}, {self.world_size} process(es) on {self.nnodes} node(s), "
                f"{self.strategy}."]

    def gap(self, key: str, instead: Any, how: str) -> Gap:
        """The gap at ``key``, its cost read from the study's verdicts."""
        value = self.knob(key)
        cost, change = measured_cost(self.effects, key, value, instead)
        return Gap(key, value, instead, how, cost, change)


def measured_cost(effects: Sequence[Effect], key: str, winner: Any, instead: Any) -> tuple[str, float | None]:
    """What ``instead`` cost against ``winner`` where the study compared exactly those two values of ``key``
    (in either direction): a sentence and the relative change of step time, or "not measured"."""
    for e in effects:
        if e.knob != key:
            continue
        if (e.reference, e.value) == (winner, instead):
            forward = True
        elif (e.reference, e.value) == (instead, winner):
            forward = False
        else:
            continue
        if e.identical:
            return f"none: {instead!r} compiled the same program as {winner!r} here (identical graphs)", 0.0
        if e.failure:
            failed = e.value
            return f"{failed!r} failed in the study ({e.failure})", None
        change, low, high = e.step_change, e.low, e.high
        if not forward:  # the effect was measured from `instead` to `winner`: invert the ratio and its interval
            change = 1 / (1 + change) - 1
            if low is not None and high is not None:
                low, high = 1 / (1 + high) - 1, 1 / (1 + low) - 1
        interval = f" [{e.level:.0%} CI {low * 100:+.1f}, {high * 100:+.1f}]" \
            if low is not None and high is not None else (f" ± {e.uncertainty:.1%}" if e.basis != "verdict" else "")
        judged = "measurable" if e.measurable else "within noise: no measurable effect"
        basis = (f"verdict phase, {e.pairs} {e.how}" if e.basis == "verdict"
                 else f"{e.pairs} matched pair(s) of the search, single-process measurements")
        compile_s = e.compile_change_s if forward else -e.compile_change_s
        return (f"step time {change:+.1%}{interval} with {instead!r} instead of {winner!r} ({judged}; {basis}); "
                f"compile {compile_s:+.1f} s"), change
    return NOT_MEASURED, None


def optimizer_hyper(workload: Any) -> tuple[str, OptimizerHyper]:
    """The workload optimizer's dotted target and its hyperparameters: the study's, else the class's defaults."""
    node = dict(workload.get("optimizer") or {})
    target = str(node.pop("_target_", "") or "")
    node.pop("_partial_", None)
    params: Mapping[str, inspect.Parameter] = {}
    module, _, name = target.rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        log.debug("optimizer %r not importable here: only the study's own hyperparameters are exported", target)
    wanted = OptimizerHyper.__annotations__
    merged = {**{k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}, **node}
    return target, cast(OptimizerHyper, {k: v for k, v in merged.items()
                                         if k in wanted and isinstance(v, int | float | tuple | list)})
