"""The models of a script that calls no ``torch.compile``, found where it trains them.

Until the script compiles, prepares or steps, :class:`ModelFinder` records the modules it calls from outside any
module's forward (global module hooks: nothing is set on the script's objects) and the optimizers it builds. At the
first optimizer step it hands the agent the called module that owns each optimizer's parameters (a GAN's generator
and discriminator both, so its later steps run the trial's program); a script that builds no optimizer (its update
by hand, ``p.data.add_(p.grad, alpha=-lr)``) has, after its first ``backward()``, the module whose parameters that
backward filled. The hooks are removed at once: none may stay where dynamo traces the script's model.

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autocompile.trial.script import hooks

Found = Callable[[list[tuple[nn.Module, str]]], None]
"""Called once with the modules found, each with where it was found (the agent takes them over in place)."""


class ModelFinder:
    """The modules the script calls and the optimizers it builds, until the first step finds its models."""

    def __init__(self, found: Found) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.found = found
        self.called: list[nn.Module] = []
        self.depth = 0
        self.handles: list[Any] = [register_module_forward_pre_hook(self._enter),
                                   register_module_forward_hook(self._leave)]
        hooks.track_optimizers()
        hooks.after_next_backward(self.trained_found)
        register_optimizer_step_post_hook(self.model_found)  # a no-op once stopped (not removable in it)

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def stop(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.called = [], []

    @torch.compiler.disable
    def _enter(self, module: nn.Module, args: Any) -> None:
        if self.depth == 0 and not any(m is module for m in self.called):
            self.called.append(module)
        self.depth += 1

    @torch.compiler.disable
    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.depth = max(self.depth - 1, 0)

    @torch.compiler.disable
    def model_found(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """At the script's first optimizer step: the module owning each optimizer's parameters."""
        if not self.active:
            return
        optimizers = [optimizer, *(o for o in hooks.built_optimizers() if o is not optimizer)]
        owners: dict[int, tuple[nn.Module, torch.optim.Optimizer]] = {}
        for o in optimizers:
            wanted = {id(q) for group in o.param_groups for q in group["params"]}
            if (model := self._most(lambda p, wanted=wanted: id(p) in wanted)) is not None:
                owners.setdefault(id(model), (model, o))
        self.stop()
        self.found([(model, f"{type(model).__name__}, the module owning {type(owned).__name__}'s parameters (no "
                            "torch.compile)") for model, owned in owners.values()])

    @torch.compiler.disable
    def trained_found(self) -> None:
        """After the script's first ``backward()`` with no optimizer built: the module whose parameters it filled."""
        if not self.active or hooks.built_optimizers():
            return  # an optimizer will step (model_found)
        model = self._most(lambda p: p.grad is not None)
        self.stop()
        if model is not None:
            self.found([(model, f"{type(model).__name__}, the module whose parameters backward() filled (no "
                                "optimizer, no torch.compile)")])

    def _most(self, counts: Callable[[nn.Parameter], bool]) -> nn.Module | None:
        """The called module holding most parameters ``counts`` (a DDP wrapper's own module), or None."""
        best, held = None, 0
        for module in self.called:
            inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
            n = sum(counts(p) for p in inner.parameters())
            if n > held:
                best, held = inner, n
        return best
