"""Every private torch name autocompile relies on, in one place: torch has no public API for what a tuner must
read (dynamo's counters, guard failures, automatic-dynamic memory, CUDA-graph recording callbacks) or set (the
DDP graph split, the recompile-limit failure, a DDP wrapper's compiled call). ``tests/test_torch_private.py``
resolves each name in :data:`REQUIRED` and :data:`OPTIONAL` on the installed torch and fails naming its version
when one moved; it also fails when a module outside this one reaches a private torch name itself.

Imports are lazy (each function imports what it returns): this module is loaded in the user's script processes,
where the agent must not import dynamo before the script does. Torch only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

REQUIRED: tuple[str, ...] = (
    "torch._dynamo.utils:counters", "torch._dynamo.utils:compile_times", "torch._dynamo.utils:guard_failures",
    "torch._dynamo.config:optimize_ddp", "torch._dynamo.config:fail_on_recompile_limit_hit",
    "torch._dynamo.config:recompile_limit", "torch._dynamo.config:accumulated_recompile_limit",
    "torch._dynamo.config:patch", "torch._functorch.config:patch",
    "torch._functorch.config:activation_memory_budget", "torch._inductor:list_mode_options",
    "torch:_TorchCompileInductorWrapper", "torch._dynamo.backends.registry:lookup_backend",
    "torch._dynamo.backends.common:aot_autograd", "torch._dynamo.backends.debugging:boxed_nop",
    "torch._functorch.partitioners:min_cut_rematerialization_partition",
    "torch._dynamo.compiled_autograd:_enable", "torch._subclasses.fake_tensor:FakeTensorMode",
    "torch._dynamo.exc:Unsupported", "torch._dynamo.callback:callback_handler",
    "torch.utils.data.dataloader:_BaseDataLoaderIter", "torch.distributed.distributed_c10d:_get_default_store",
    "torch.nn.modules.module:Module._compiled_call_impl",
)
"""``module:attribute`` of each private name used; a missing one breaks a trial."""
OPTIONAL: tuple[str, ...] = (
    "torch._dynamo.pgo:get_code_state", "torch._dynamo.pgo:reset_code_state", "torch._dynamo.pgo:CodeId",
    "torch._dynamo.pgo:_INIT_CODE_STATE",
    "torch._dynamo.callback:CallbackTrigger.CUDAGRAPH_RECORDING",
)
"""Names a torch may lack (read where present; without them a reading is skipped and says so)."""
LOGGERS = {"codecache": "torch._inductor.codecache", "convert_frame": "torch._dynamo.convert_frame"}
"""Torch's loggers whose records autocompile reads (FX-graph cache keys; recompile-limit hits)."""


def resolve(name: str) -> Any:
    """The object ``module:attribute.path`` names (AttributeError / ImportError when torch moved it)."""
    module, _, path = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def counters() -> Any:
    """Dynamo's counters: ``frames``, ``stats``, ``graph_break``, ``inductor`` (``cudagraph_skips``)."""
    from torch._dynamo.utils import counters

    return counters


def compile_times() -> dict[str, float]:
    """Dynamo's own seconds per compile phase, summed over its compiles."""
    from torch._dynamo.utils import compile_times

    names, seconds = compile_times(repr="csv", aggregate=True)
    return {n: float(s) for n, s in zip(names, seconds, strict=True)}


def guard_failures() -> Any:
    """Each code object's failed guards, as ``TORCH_LOGS=recompiles`` says them."""
    from torch._dynamo.utils import guard_failures

    return guard_failures


def dynamo_config() -> ModuleType:
    """``torch._dynamo.config``: ``optimize_ddp``, ``fail_on_recompile_limit_hit``, the recompile limits, ``patch``."""
    import torch._dynamo.config as config

    return config


def memory_budget(budget: float) -> Any:
    """AOTAutograd's activation memory budget, set for a block (``ac.policy=budget_*``)."""
    import torch._functorch.config as config

    return config.patch(activation_memory_budget=budget)


def mode_options(mode: str | None = None) -> Any:
    """The inductor options a ``torch.compile`` mode sets (every mode's, by mode, without one)."""
    from torch._inductor import list_mode_options

    return list_mode_options(mode) if mode is not None else list_mode_options()


def has_memory_budget() -> bool:
    """This torch's AOTAutograd partitioner takes an activation memory budget."""
    import torch._functorch.config as config

    return hasattr(config, "activation_memory_budget")


def inductor(mode: str | None, options: dict[str, Any] | None, dynamic: bool | None) -> Callable[..., Any]:
    """Inductor exactly as ``torch.compile(backend="inductor", mode=..., options=...)`` builds it."""
    return torch._TorchCompileInductorWrapper(mode, options, dynamic)


def backend(name: str) -> Callable[..., Any]:
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend(name)


def aot_eager_parts() -> tuple[Any, Any, Any]:
    """What ``aot_eager`` is made of: ``aot_autograd``, ``boxed_nop``, the min-cut partitioner."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd, boxed_nop, min_cut_rematerialization_partition


def compiled_autograd_context(compiler: Callable[..., Any]) -> Any:
    """A context that runs the backward through compiled autograd with ``compiler``."""
    return torch._dynamo.compiled_autograd._enable(compiler)


def fake_tensor_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def dynamo_exc() -> ModuleType:
    import torch._dynamo.exc as exc

    return exc


def dynamo_pgo() -> ModuleType:
    """Dynamo's automatic-dynamic memory per code object (torch 2.6+; ImportError before)."""
    from torch._dynamo import pgo

    return pgo


def dynamo_callbacks() -> ModuleType:
    from torch._dynamo import callback

    return callback


def data_loader_iter() -> type:
    """The base class of a ``DataLoader``'s iterators (its ``__next__`` is where a script waits for data)."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter


def default_store() -> Any:
    """The rendezvous store of the default process group (ranks agree through it outside collectives)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def set_compiled_call(module: torch.nn.Module, call: Callable[..., Any]) -> None:
    """Compile ``module``'s call in place, as ``nn.Module.compile`` does (its ``_compiled_call_impl``)."""
    module._compiled_call_impl = call  # type: ignore[assignment]
