"""Where the meter listens to the script: its model's forward, ``Tensor.backward``, every optimizer's step, a
``GradScaler`` step that skips its optimizer, the optimizers it builds and the batches it waits for.

Every hook leaves the script's objects as they were to pickle: the forward hook on the model is a
:class:`ForwardHook` that holds nothing, and the forwards the agent compiled or checkpointed in place are closures;
``nn.Module.__getstate__`` leaves both out (as torch leaves out ``module.compile()``'s ``_compiled_call_impl``), so
``torch.save(model, f)`` (pytorch/examples' word_language_model), ``pickle`` and ``copy.deepcopy`` see the script's
own model, eager and unmeasured; the rest are patches of torch's classes or torch's global hooks, never of the
script's objects.
The hooks reach the meter through this module's ``_METER``.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from autocompile.config.torch_private import data_loader_iter


class Listener(Protocol):
    """What the hooks tell (the :class:`~autocompile.trial.script.meter.Meter`)."""

    finished: bool

    def on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...
    def on_backward(self, loss: torch.Tensor) -> None: ...
    def after_backward(self) -> None: ...
    def on_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_optimizer_built(self) -> None: ...
    def on_batch(self, waited: float, queued: int) -> None: ...
    def on_spawn(self) -> None: ...


_METER: Listener | None = None
_OWN_FORWARDS: dict[int, Any] = {}
"""``id(module)``: the ``forward`` the agent set on it (compiled, checkpointed), left out when it is pickled."""
_OPTIMIZER_STEPS = [0]
"""Optimizer steps seen by the global post-hook: a ``GradScaler.step`` that adds none skipped its optimizer."""
_BUILT: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
"""Every optimizer the process built since :func:`track_optimizers` (a GAN's two: both models are taken over)."""
_AFTER_BACKWARD: list[Callable[[], None]] = []
"""Called once each, after the next ``backward()`` (:func:`after_next_backward`)."""


class ForwardHook:
    """The forward pre-hook on the module the script calls: no state, and left out when the module is pickled."""

    __slots__ = ()

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _forward(args, kwargs)


@torch.compiler.disable  # the meter's Python, never traced into the script's graphs
def _forward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if _METER is not None:
        _METER.on_forward(args, kwargs)


@torch.compiler.disable
def _optimizer_stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    _OPTIMIZER_STEPS[0] += 1
    if _METER is not None:
        _METER.on_optimizer_step(optimizer)


def watch_forward(module: nn.Module) -> None:
    """Tell the meter of each call of ``module`` (what the script calls: its items are counted)."""
    module.register_forward_pre_hook(ForwardHook(), with_kwargs=True)


def leave_out_forward(modules: list[nn.Module]) -> None:
    """``modules`` pickle and copy with their class's forward, not the one the agent set on them."""
    keep_picklable()
    for module in modules:
        _OWN_FORWARDS[id(module)] = module.__dict__.get("forward")


def keep_picklable() -> None:
    """Leave the agent's hooks and forwards out of pickled and copied modules (once per process)."""
    _patch_once(nn.Module, "__getstate__", _without_agent)


def install(meter: Listener) -> None:
    """Listen for ``meter`` (once per process)."""
    global _METER
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _METER = meter
    register_optimizer_step_post_hook(_optimizer_stepped)
    keep_picklable()
    track_optimizers()
    _patch_once(torch.Tensor, "backward", _backward)
    _patch(torch.amp.GradScaler, "step", _scaler_step)
    _patch(data_loader_iter(), "__next__", _next_batch)
    import torch.multiprocessing as torch_mp

    # mp.spawn calls its module's start_processes; a script may call start_processes itself.
    for owner in (sys.modules["torch.multiprocessing.spawn"], torch_mp):
        _patch(owner, "start_processes", _start_processes)  # type: ignore[arg-type]


def track_optimizers() -> None:
    """Keep every optimizer built from here (:func:`built_optimizers`); the meter told of each (once per process)."""
    _patch_once(torch.optim.Optimizer, "__init__", _optimizer_init)


def built_optimizers() -> list[torch.optim.Optimizer]:
    return list(_BUILT)


def after_next_backward(callback: Callable[[], None]) -> None:
    """Call ``callback`` once, after the script's next ``backward()`` has filled the gradients."""
    _patch_once(torch.Tensor, "backward", _backward)
    _AFTER_BACKWARD.append(callback)


def _patch(owner: type, name: str, make: Any) -> None:
    real = getattr(owner, name)
    setattr(owner, name, functools.wraps(real)(make(real)))


def _patch_once(owner: type, name: str, make: Any) -> None:
    if not getattr(getattr(owner, name), "_autocompile", False):
        _patch(owner, name, make)
        getattr(owner, name)._autocompile = True


def _without_agent(real: Any) -> Any:
    def __getstate__(self: nn.Module) -> Any:
        state = real(self)
        own = _OWN_FORWARDS.get(id(self))
        if own is not None and state.get("forward") is own:
            del state["forward"]
        hooks = state.get("_forward_pre_hooks")
        ours = [k for k, h in hooks.items() if isinstance(h, ForwardHook)] if hooks else []
        if ours:  # state is a copy of __dict__: its hook dicts are replaced, the module's own kept
            state["_forward_pre_hooks"] = OrderedDict((k, h) for k, h in hooks.items() if k not in ours)
            state["_forward_pre_hooks_with_kwargs"] = {
                k: v for k, v in state.get("_forward_pre_hooks_with_kwargs", {}).items() if k not in ours}
        return state

    return __getstate__


def _backward(real: Any) -> Any:
    def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        meter = _METER
        if meter is None or meter.finished or tensor.numel() != 1:
            out = real(tensor, *args, **kwargs)
        else:
            meter.on_backward(tensor)
            out = real(tensor, *args, **kwargs)
            meter.after_backward()
        while _AFTER_BACKWARD:
            _AFTER_BACKWARD.pop(0)()
        return out

    return backward


def _scaler_step(real: Any) -> Any:
    def step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        before = _OPTIMIZER_STEPS[0]
        out = real(scaler, optimizer, *args, **kwargs)
        if _OPTIMIZER_STEPS[0] == before and _METER is not None:
            _METER.on_optimizer_step(optimizer)  # inf/NaN gradients: skipped, yet an iteration of the script
        return out

    return step


def _optimizer_init(real: Any) -> Any:
    def __init__(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        real(optimizer, *args, **kwargs)
        _BUILT.add(optimizer)
        if _METER is not None:
            _METER.on_optimizer_built()

    return __init__


def _start_processes(real: Any) -> Any:
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        if _METER is not None:
            _METER.on_spawn()  # its children run the training where the agent is not (the script's refusal)
        return real(*args, **kwargs)

    return start_processes


def _next_batch(real: Any) -> Any:
    def __next__(iterator: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(iterator)
        finally:
            if _METER is not None:
                # batches a loader's workers may hold ready: what a long compile lets them fill
                queued = getattr(iterator, "_num_workers", 0) * (getattr(iterator, "_prefetch_factor", None) or 0)
                _METER.on_batch(time.perf_counter() - start, queued)

    return __next__
