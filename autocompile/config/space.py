"""The search space: the knob table read as Optuna's define-by-run conditional space."""

from __future__ import annotations

from typing import Any

import optuna

from autocompile.config.choices import Knobs
from autocompile.config.gpus import native_bf16
from autocompile.config.knobs import KNOBS, Env, KnobError, TrialConfig

BASELINES = {
    "eager": {"compile.scope": "none"},
    "compile": {"compile.scope": "module"},
    "regional": {"compile.scope": "regional"},
}
"""Measured first, and every result is also a speedup over them: no compile, the default
``torch.compile(model)``, and the default regional compile."""
AS_WRITTEN = "as_written"
"""A script study's fourth baseline: its own ``torch.compile`` arguments (``study/search/baselines.py``)."""
CONFIRMED_BASELINES = ("eager", "compile", AS_WRITTEN)
"""The baselines the confirmation times again beside its candidates, each with its gain."""


DEFAULTS = {key: default for key, (_, default) in KNOBS.items()}
"""Every knob at its default: where a knob's full set of values is read."""


def lead_knobs(start_precision: str, device: str, fixed: Knobs) -> Knobs:
    """Where the search starts (``study.start_precision``): the knob values its first trials take beside the
    defaults, unless the user fixed them; ``auto`` is bf16 on a GPU that runs it natively (nvidia-smi)."""
    precision = start_precision
    if precision == "auto":
        precision = "bfloat16" if device == "cuda" and native_bf16() else "none"
    if "amp.dtype" in fixed or precision == "none":
        return {}
    return {"amp.dtype": precision}


class SearchSpace:
    """Knobs in declaration order: fixed ones are taken as given, inactive ones skipped, a knob with
    one possible value is not asked for, the rest are suggested under their dotted key."""

    def __init__(self, env: Env, fixed: Knobs, extended: bool = False,
                 lead: Knobs | None = None) -> None:
        self.env = env
        self.fixed = fixed
        self.extended = extended
        TrialConfig.from_flat(fixed, env, strict=False)  # fixed values are valid on their own
        self.lead = {k: v for k, v in (lead or {}).items()
                     if k not in fixed and v in self.options(k, {**DEFAULTS, **fixed})}
        """Where a practitioner starts (``Settings.lead_knobs``: bf16 autocast on a GPU that runs it natively):
        the values the baselines and the plan's first trials take beside the defaults; those the space does
        not offer are dropped."""

    def start(self, **knobs: Any) -> Knobs:
        """A configuration where the search starts: the defaults, the lead values, the fixed knobs, ``knobs``."""
        return self.normalised({**DEFAULTS, **self.lead, **self.fixed, **knobs})

    def options(self, key: str, values: Knobs) -> tuple[Any, ...]:
        """What knob ``key`` may be, given the knobs before it."""
        spec, default = KNOBS[key]
        if spec.when is not None and not spec.when.test(values, self.env):
            return (default,)
        if key in self.fixed:
            return (self.fixed[key],)
        if spec.extended and not self.extended:
            return (default,)
        return self.keeping_fixed(key, values, spec.searched(values, self.env))

    def keeping_fixed(self, key: str, values: Knobs, choices: tuple[Any, ...]) -> tuple[Any, ...]:
        """``choices`` less those that rule out a fixed knob's value further down the table (a fixed
        ``amp.dtype=float16`` takes the CUDA-graph modes out of ``train_step``, a fixed ``optim.impl=fused`` the
        compiled optimizer step), judged with the knobs in between at their defaults; all of them when none is
        left (validation then names the clash)."""
        later = [k for k in list(KNOBS)[list(KNOBS).index(key) + 1:] if k in self.fixed]
        if not later:
            return choices
        kept = tuple(c for c in choices if self.fixed_allowed({**DEFAULTS, **values, key: c, **self.fixed}, later))
        return kept or choices

    def fixed_allowed(self, probe: Knobs, keys: list[str]) -> bool:
        """Whether each of ``keys`` that applies under ``probe`` may take its value there."""
        for key in keys:
            spec, _ = KNOBS[key]
            applies = spec.when is None or spec.when.test(probe, self.env)
            if applies and probe[key] not in spec.allowed(probe, self.env):
                return False
        return True

    def param_name(self, key: str, choices: tuple[Any, ...]) -> str:
        """The Optuna parameter for ``key`` offered ``choices``. Optuna fixes one distribution per name,
        so where earlier knobs narrow a knob's values (optim.impl loses fused when the optimizer step is
        compiled) the narrowed set is a parameter of its own: ``optim.impl[default|foreach]``."""
        spec, _ = KNOBS[key]
        if tuple(choices) == spec.searched(DEFAULTS, self.env):
            return key
        return f"{key}[{'|'.join(map(str, choices))}]"

    def sample(self, trial: optuna.Trial) -> TrialConfig:
        values: Knobs = {}
        for key in KNOBS:
            choices = self.options(key, values)
            values[key] = (trial.suggest_categorical(self.param_name(key, choices), choices) if len(choices) > 1
                           else choices[0])
        return TrialConfig.from_flat(values, self.env)

    def baseline_params(self, name: str) -> Knobs:
        """The Optuna params that make ``sample`` return the baseline (defaults elsewhere)."""
        TrialConfig.from_flat({**self.fixed, **BASELINES[name]}, self.env, strict=False)  # KnobError: not here
        return self.params(self.start(**BASELINES[name]))

    def baseline_identities(self) -> dict[str | None, str]:
        """Configuration identity -> baseline name, for each baseline this space can run."""
        found: dict[str | None, str] = {}
        for name, knobs in BASELINES.items():
            try:
                found[identity(TrialConfig.from_flat(self.start(**knobs), self.env, strict=False), self.env)] = name
            except KnobError:
                continue  # not here (regional on a model without blocks)
        return found

    def offered_params(self, knobs: Knobs) -> Knobs:
        """The Optuna params that make ``sample`` return ``knobs`` (defaults elsewhere); a KnobError naming the first
        of ``knobs`` this space does not offer where it stands (not searched here, or not applying there)."""
        flat = self.start(**knobs)
        values: Knobs = {}
        for key in KNOBS:
            choices = self.options(key, values)
            if key in knobs and knobs[key] not in choices:
                raise KnobError(f"{key}={knobs[key]!r} is not offered here (choices: "
                                f"{', '.join(map(repr, choices))})")
            values[key] = flat[key]
        return self.params(flat)

    def params(self, flat: Knobs) -> Knobs:
        """The Optuna params that make ``sample`` return the configuration ``flat`` (every knob's value)."""
        values: Knobs = {}
        params = {}
        for key in KNOBS:
            choices = self.options(key, values)
            if len(choices) > 1:
                params[self.param_name(key, choices)] = flat[key]
            values[key] = flat[key]
        return params

    def configuration(self, params: Knobs) -> Knobs | None:
        """The configuration (every knob's value) that ``sample`` makes of Optuna ``params``; None when
        a knob it would ask for is not among them (the sampler would choose it)."""
        values: Knobs = {}
        for key in KNOBS:
            choices = self.options(key, values)
            if len(choices) == 1:
                values[key] = choices[0]
            elif (name := self.param_name(key, choices)) in params:
                values[key] = params[name]
            else:
                return None
        return values

    def normalised(self, flat: Knobs) -> Knobs:
        """``flat`` walked in knob order as :meth:`sample` walks it: a value the knobs before it do not
        allow (inactive, or narrowed away) becomes the first it may be. A one-knob change of a
        configuration, made valid."""
        values: Knobs = {}
        for key in KNOBS:
            choices = self.options(key, values)
            values[key] = flat[key] if key in flat and flat[key] in choices else choices[0]
        return values

    def configurations(self) -> list[Knobs]:
        """Every configuration (each knob's value, in knob order), as :meth:`size` counts them."""
        found: list[Knobs] = [{}]
        for key in KNOBS:
            found = [{**values, key: choice} for values in found for choice in self.options(key, values)]
        return found

    def size(self) -> int:
        """Distinct configurations. Inactive knobs only ever take their default, so every path
        through the knob table is a different configuration: count paths, build nothing."""

        def count(values: Knobs, keys: list[str]) -> int:
            if not keys:
                return 1
            return sum(count({**values, keys[0]: choice}, keys[1:]) for choice in self.options(keys[0], values))

        return count({}, list(KNOBS))


def identity(config: TrialConfig, env: Env) -> str:
    """A configuration's identity: its active knobs, canonically ordered."""
    return ",".join(f"{k}={v!r}" for k, v in sorted(config.active(env).items()))
