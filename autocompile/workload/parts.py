"""The parts of a training job besides the model, each named by a Hydra-style ``_target_``.

Hydra's own ``instantiate`` is not used: the worker runs where only PyTorch is installed. The
rules follow Hydra's where they overlap: keys beside ``_target_`` are keyword arguments, and
``_partial_: true`` makes a partial that autocompile completes:

- ``workload.optimizer`` / ``workload.lr_schedule``: always partials, completed with the model's
  parameters / the optimizer (``_target_: null`` schedule = constant learning rate).
- ``workload.data`` / ``workload.loss``: a class is built once with its keys (``_partial_: false``
  does the same for a factory function); a function is the part itself (``_partial_: true``, the
  default for functions), its keys bound as keyword arguments. Data is then called with the step
  index, a loss with ``(output, targets)``. Data also gets, by parameter name, the job facts it
  takes: ``batch_size``, ``seq_len`` (the list), ``seed``, ``rank``, ``world_size``, ``device``, and
  what the model says (``vocab_size``, ``image_size``, ``num_channels``, ``num_labels``: see ``infer``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, TypedDict, cast

import torch

from autocompile.workload import TargetNode
from autocompile.workload.infer import ModelFacts

log = logging.getLogger(__name__)

Batches = Callable[[int], tuple[Any, Any]]
IMPL_KWARGS = {"default": {}, "for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""``optim.impl`` as optimizer arguments."""


class DataFacts(ModelFacts, total=False):
    """What the data part may take by parameter name: the model's facts and the job's (the tuner's check sets
    placeholders: one row, no lengths, rank 0 of 1 on the CPU)."""

    batch_size: int
    seq_len: list[int]
    """The workload's lengths, cycled per step."""
    seed: int
    rank: int
    world_size: int
    device: str | torch.device


class KnobFacts(TypedDict):
    """What the job's parts allow (``knob_facts``): fields of ``config.knob_spec.Env`` of the same names."""

    optimizer_impls: tuple[str, ...]
    """``optim.impl`` values worth a trial besides ``default`` (``optimizer_impls``)."""
    scheduled: bool
    """The workload has a learning-rate schedule."""
    clips: bool
    accumulates: bool


class PartError(ValueError):
    """A part that cannot be built; the message names the key and the fix."""


def import_target(path: str, key: str, error: type[Exception] = PartError) -> Any:
    """The object a ``_target_`` names (``pkg.module.name``), for the config key ``key`` (``workload.data``,
    ``model``): the one place a dotted path is imported. The ``error`` raised names the key and the path."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise error(f"{key}._target_={path!r} does not import ({exc}): check the dotted path") from exc


def split(node: TargetNode, key: str) -> tuple[Any, bool | None, dict[str, Any]]:
    """(target object, ``_partial_`` or None when not given, keyword arguments)."""
    kwargs = {k: v for k, v in node.items() if k not in ("_target_", "_partial_")}
    return import_target(_target(node), key), node.get("_partial_"), kwargs


def _target(node: TargetNode) -> str:
    """The dotted path of a part that has one: only ``lr_schedule``'s is null, and ``schedule_factory`` builds
    nothing then (``Workload`` checks every other one is a dotted path)."""
    return cast(str, node["_target_"])


def _parameters(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        params = dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin: nothing known
        return {}
    params.pop("self", None)
    return params


def _built_once(target: Any, partial: bool | None) -> bool:
    return partial is False or (partial is None and inspect.isclass(target))


def _facts_taken(fn: Any, facts: DataFacts, skip_first: bool) -> dict[str, Any]:
    params = _parameters(fn)
    if skip_first and params:
        params.pop(next(iter(params)))
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(facts)
    return {k: v for k, v in facts.items() if k in params}


def data_needs(node: TargetNode, facts: DataFacts) -> list[str]:
    """Required arguments of the data part that neither its keys nor the facts give."""
    target, partial, kwargs = split(node, "workload.data")
    params = _parameters(target)
    if not _built_once(target, partial) and params:
        params.pop(next(iter(params)))  # the step index
    return [name for name, p in params.items() if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in kwargs and name not in facts]


def data_problem(node: TargetNode, facts: DataFacts) -> str | None:
    """What keeps the data part from being built, in one line, or None: a required argument nobody gives,
    or what its own ``check_facts(facts)`` finds wrong with the facts (a data part that follows the model)."""
    missing = data_needs(node, facts)
    if missing:
        return need_message("workload.data", _target(node), missing[0])
    target, _, kwargs = split(node, "workload.data")
    check = getattr(target, "check_facts", None)
    return check({**facts, **kwargs}, _target(node)) if callable(check) else None


def build_data(node: TargetNode, facts: DataFacts) -> Batches:
    """``step -> (inputs, targets)`` from ``workload.data``."""
    target, partial, kwargs = split(node, "workload.data")
    problem = data_problem(node, facts)
    if problem:
        raise PartError(problem)
    if _built_once(target, partial):
        built = target(**{**_facts_taken(target, facts, False), **kwargs})
        fn = built if callable(built) else getattr(built, "batch", None)
        if fn is None:
            raise PartError(f"workload.data._target_={node['_target_']!r} built a {type(built).__name__}, which is "
                            "neither callable nor has .batch(step): return (inputs, targets) for a step index")
        return fn
    return functools.partial(target, **{**_facts_taken(target, facts, True), **kwargs})


def need_message(key: str, target: str, name: str) -> str:
    if name == "vocab_size":
        return (f"{key} {target} needs vocab_size and the model has no input embedding to read it from: "
                "set model.vocab_size=N")
    return f"{key} {target} needs {name!r}, which neither the job nor the model says: set +{key}.{name}=VALUE"


def build_loss(node: TargetNode) -> Callable[[Any, Any], torch.Tensor]:
    """``(output, targets) -> loss`` from ``workload.loss``."""
    target, partial, kwargs = split(node, "workload.loss")
    if _built_once(target, partial):
        return target(**kwargs)
    return functools.partial(target, **kwargs) if kwargs else target


def optimizer_factory(node: TargetNode) -> Callable[..., torch.optim.Optimizer]:
    """``params, **impl -> Optimizer`` from ``workload.optimizer``."""
    target, _, kwargs = split(node, "workload.optimizer")
    return functools.partial(target, **kwargs)


def schedule_factory(node: TargetNode) -> Callable[[torch.optim.Optimizer], Any] | None:
    """``optimizer -> LR scheduler`` from ``workload.lr_schedule``; None for a constant learning rate."""
    if node.get("_target_") is None:
        return None
    target, _, kwargs = split(node, "workload.lr_schedule")
    return functools.partial(target, **kwargs)


_IMPLS: dict[str, tuple[str, ...]] = {}


def optimizer_impls(node: TargetNode, device: str) -> tuple[str, ...]:
    """The ``optim.impl`` values worth a trial besides ``default``: the ones the optimizer takes (fused is
    probed by building it on one parameter), minus the device's own default (foreach on CUDA, the for-loop
    on CPU), none when the workload's optimizer sets foreach or fused itself."""
    key = json.dumps([node, device], sort_keys=True, default=str)
    if key not in _IMPLS:
        _IMPLS[key] = _optimizer_impls(node, device)
    return _IMPLS[key]


def _optimizer_impls(node: TargetNode, device: str) -> tuple[str, ...]:
    if {"foreach", "fused"} & set(node):
        return ()
    target, _, kwargs = split(node, "workload.optimizer")
    params = _parameters(target)
    impls = [impl for impl in ("for_loop", "foreach") if "foreach" in params
             and impl != ("foreach" if device == "cuda" else "for_loop")]
    if "fused" in params:
        try:
            # On the CPU whatever the device: a CUDA tensor here would make a CUDA context in the tuner for the
            # whole study. Nothing is lost: torch's optimizers check fused's device at their first step
            # (_device_dtype_check_for_fused in _init_group: torch/optim/adam.py, sgd.py, adagrad.py), not when
            # built, so the probe only ever asked whether the constructor takes fused=True.
            target([torch.zeros(2, requires_grad=True)], **{**kwargs, "fused": True})
            impls.append("fused")
        except Exception as exc:  # noqa: BLE001 (any failure of the probe means "not here": no CUDA, old torch)
            log.info("optim.impl=fused not offered: %s", str(exc).splitlines()[0] if str(exc) else exc)
    return tuple(impls)


def knob_facts(workload: Any, device: str) -> KnobFacts:
    """What the job's parts allow, for ``knobs.Env``."""
    return {"optimizer_impls": optimizer_impls(workload.optimizer, device),
            "scheduled": workload.lr_schedule.get("_target_") is not None,
            "clips": workload.grad_clip_norm > 0, "accumulates": workload.grad_accum_steps > 1}
