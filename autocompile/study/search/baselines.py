"""The baselines every result is measured against, queued ahead of the sampled trials: eager, the default
``torch.compile(model)``, the default regional compile, and, for a script that passes ``torch.compile`` its own
arguments, the script as written (``as_written``: its own mode, fullgraph, dynamic, backend and options).

The agent compiles what the script compiles, where it compiles it, under ``compile.scope=module``; the knobs the
script passed are read from its eager reference run (``script.compile_calls``), so "as written" is that scope with
them. Where they cannot be one configuration of the space (calls that disagree, a backend given as a function, a
value not offered here), the study says why and has no such baseline.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from autocompile.config.choices import Knobs
from autocompile.config.knobs import KNOBS, KnobError
from autocompile.config.space import AS_WRITTEN, BASELINES, SearchSpace
from autocompile.study.records.record import user_attrs

log = logging.getLogger(__name__)

ARGUMENT_KNOBS = {"mode": "compile.mode", "fullgraph": "compile.fullgraph", "dynamic": "compile.dynamic",
                  "backend": "compile.backend"}
"""``torch.compile`` keyword -> knob (``options`` maps key by key onto ``compile.options.*``)."""


def clash(space: SearchSpace, knobs: Knobs) -> Knobs:
    """The fixed knobs ``knobs`` contradicts."""
    return {k: v for k, v in space.fixed.items() if k in knobs and knobs[k] != v}


def queue_baselines(study: optuna.Study, space: SearchSpace) -> None:
    """Queue eager, default compile and default regional, each unless the fixed knobs or the model rule it out."""
    for name, knobs in BASELINES.items():
        if contradicted := clash(space, knobs):
            log.info("baseline %s skipped: it contradicts the fixed knobs %s", name, contradicted)
            continue
        try:
            params = space.baseline_params(name)
        except KnobError as exc:  # e.g. regional on a model without repeated blocks
            log.info("baseline %s skipped: %s", name, exc)
            continue
        study.enqueue_trial(params, user_attrs=user_attrs(baseline=name), skip_if_exists=True)


def as_written(calls: Sequence[Mapping[str, Any]]) -> tuple[Knobs | None, str]:
    """The knobs of the script's own ``torch.compile`` arguments (``script.compile_calls``: each call's keyword
    arguments as ``repr``), or None and why they are none."""
    kwargs = [dict(c["kwargs"]) for c in calls if c["kwargs"].get("disable") != "True"]
    if not kwargs:
        return None, "the script calls no torch.compile: as written, it runs eager (the eager baseline)"
    if any(k != kwargs[0] for k in kwargs[1:]):
        where = ", ".join(c["where"] for c in calls)
        return None, f"the script's torch.compile calls ({where}) pass different arguments"
    knobs: Knobs = {"compile.scope": "module"}
    for name, text in kwargs[0].items():
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None, f"torch.compile({name}={text}) is not a value a knob takes"
        if name == "options" and isinstance(value, dict):
            for option, v in value.items():
                if f"compile.options.{option}" not in KNOBS:
                    return None, f"torch.compile(options={{{option!r}: ...}}) has no knob"
                knobs[f"compile.options.{option}"] = v
        elif name in ARGUMENT_KNOBS:
            knobs[ARGUMENT_KNOBS[name]] = value
        elif name != "disable":
            return None, f"torch.compile({name}=...) has no knob"
    return knobs, ""


def queue_as_written(study: optuna.Study, space: SearchSpace, calls: Sequence[Mapping[str, Any]]) -> Knobs | None:
    """Queue the script as written when its arguments differ from the default compile's and the space offers
    them; its knobs, or None (logged: why not)."""
    knobs, why = as_written(calls)
    if knobs is not None and all(KNOBS[k][1] == v for k, v in knobs.items() if k != "compile.scope"):
        knobs, why = None, "the script's torch.compile passes the defaults: the compile baseline is it as written"
    if knobs is not None and (contradicted := clash(space, knobs)):
        knobs, why = None, f"its arguments contradict the fixed knobs {contradicted}"
    if knobs is not None:
        try:
            params = space.offered_params(knobs)
        except KnobError as exc:
            knobs, why = None, str(exc)
    if knobs is None:
        log.info("baseline %s: none (%s)", AS_WRITTEN, why)
        return None
    study.enqueue_trial(params, user_attrs=user_attrs(baseline=AS_WRITTEN), skip_if_exists=True)
    log.info("baseline %s: the script's own torch.compile arguments (%s)", AS_WRITTEN,
             ", ".join(f"{k}={v!r}" for k, v in knobs.items()))
    return knobs
