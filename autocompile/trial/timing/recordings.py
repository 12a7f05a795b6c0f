"""CUDA graphs that inductor's cudagraph trees recorded in this process: first recordings and re-recordings.

Dynamo's frame counter misses them: a cudagraph tree records a function on its second call (the first runs in
its warm-up), records a new graph per shape under dynamic shapes, and records again whenever a static input
moves (FSDP2 re-allocates parameter storages: pytorch#183451). Each recording synchronizes the device and
copies inputs, so one in a timed window is compile work, like a recompile. They are counted through dynamo's
compilation callbacks: ``CUDAGraphTreeManager.record_function`` runs inside
``callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, ...)`` (torch/_inductor/cudagraph_trees.py).
"""

from __future__ import annotations

import logging
from typing import Any

from autocompile.config.torch_private import counters, dynamo_callbacks

log = logging.getLogger(__name__)

_state = {"recorded": 0, "unseen": False}


def _count(args: Any) -> None:
    if getattr(args.callback_trigger, "name", None) == "CUDAGRAPH_RECORDING":
        _state["recorded"] += 1


def cudagraph_recordings() -> int:
    """CUDA graphs recorded in this process since the first call of this function: call it before compiled code
    runs, and the difference of two calls is what was recorded between them. ``torch._dynamo.reset()`` drops
    dynamo's callbacks: the next call installs the counter again. Always 0 on a torch without the recording
    callback (logged once)."""
    dynamo_callback = dynamo_callbacks()
    trigger = getattr(dynamo_callback, "CallbackTrigger", None)
    if trigger is None or not hasattr(trigger, "CUDAGRAPH_RECORDING"):
        if not _state["unseen"]:
            log.warning("this torch has no CUDA-graph recording callback: re-recordings while timing go unseen")
            _state["unseen"] = True
        return 0
    handler = dynamo_callback.callback_handler
    if _count not in handler.start_callbacks:
        handler.register_start_callback(_count)
    return int(_state["recorded"])


def compile_events() -> int:
    """Frames dynamo compiled and CUDA graphs recorded in this process so far: a window in which this grows was
    compile work, not the steady state."""
    return int(counters()["frames"]["total"]) + cudagraph_recordings()
