"""Compile work in this process, counted as it starts: dynamo's frame compiles and the CUDA graphs inductor's
cudagraph trees record (first recordings and re-recordings).

Dynamo's frame counter (``counters["frames"]["total"]``) misses both kinds:

- a frame compiled with ``fullgraph=True``: torch 2.13 counts no frame for it, so a recompile of a new shape inside
  a timed window went unseen (pytorch/examples' dcgan under ``compile.mode=lite, compile.fullgraph=True``: its last
  batch of each epoch, a smaller one, recompiled in a 5.6 s window timed as steady state, CV 316 %);
- a CUDA graph recording: a cudagraph tree records a function on its second call (the first runs in its warm-up),
  records a new graph per shape under dynamic shapes, and records again whenever a static input moves (FSDP2
  re-allocates parameter storages: pytorch#183451). Each recording synchronizes the device and copies inputs.

Both run inside dynamo's compilation callbacks: ``_compile`` under ``callback_handler.install_callbacks(
CallbackTrigger.DYNAMO, ...)`` (torch/_dynamo/convert_frame.py), ``CUDAGraphTreeManager.record_function`` under
``CallbackTrigger.CUDAGRAPH_RECORDING`` (torch/_inductor/cudagraph_trees.py); a lazily compiled backward and
inductor's autotuning at run time are triggers too. One in a timed window is compile work, like a recompile.
"""

from __future__ import annotations

import logging
from typing import Any

from autocompile.config.torch_private import counters, dynamo_callbacks

log = logging.getLogger(__name__)

_state = {"recorded": 0, "started": 0, "unseen": False}


def _count(args: Any) -> None:
    if getattr(args.callback_trigger, "name", None) == "CUDAGRAPH_RECORDING":
        _state["recorded"] += 1
    else:
        _state["started"] += 1


def _install() -> bool:
    """The counter on dynamo's callbacks (again after a ``torch._dynamo.reset()``, which drops them); False on a
    torch without them (logged once)."""
    dynamo_callback = dynamo_callbacks()
    handler = getattr(dynamo_callback, "callback_handler", None)
    if handler is None or not hasattr(handler, "register_start_callback"):
        if not _state["unseen"]:
            log.warning("this torch has no compilation callbacks: fullgraph recompiles and CUDA-graph re-recordings "
                        "while timing go unseen")
            _state["unseen"] = True
        return False
    if _count not in handler.start_callbacks:
        handler.register_start_callback(_count)
    return True


def cudagraph_recordings() -> int:
    """CUDA graphs recorded in this process since the counter was installed (the first call of this or
    :func:`compile_events`): call one before compiled code runs, and the difference of two calls is what was recorded
    between them. Always 0 on a torch without the recording callback."""
    _install()
    return int(_state["recorded"])


def compile_events() -> int:
    """Frames dynamo compiled, compiles that started (fullgraph ones included) and CUDA graphs recorded in this process
    so far: a window in which this grows was compile work, not the steady state."""
    _install()
    return int(counters()["frames"]["total"]) + int(_state["started"]) + int(_state["recorded"])
