"""FLOPs of one training step of any model, counted by ``torch.utils.flop_counter.FlopCounterMode``.

The model is built again on the meta device and run under ``FakeTensorMode`` with fake parameters
on the trial's device type: no memory, no compute, and the same kernels as the real step (on the
meta device itself SDPA takes another path and counts differently; Hugging Face models skip their
data-dependent mask checks for fake tensors, which meta tensors fail with "Tensor.item() cannot be
called on meta tensors"). Forward, loss and backward are counted; the optimizer's elementwise
work is not (as in 6N). Torch only: the worker runs this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autocompile.config.torch_private import fake_tensor_mode
from autocompile.workload.data import map_tensors

log = logging.getLogger(__name__)


def step_flops(build: Callable[[], nn.Module], loss_fn: Callable[[Any, Any], torch.Tensor],
               batches: list[tuple[Any, Any]], device: torch.device) -> float:
    """Total FLOPs of forward, loss and backward over ``batches`` (fresh fake weights per call)."""
    from torch.func import functional_call
    from torch.utils.flop_counter import FlopCounterMode

    from autocompile.trial.program.step import _call

    with torch.device("meta"):
        model = build()
    mode = fake_tensor_mode()
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with mode:
        state = {k: torch.empty(v.shape, dtype=v.dtype, device=device).requires_grad_(v.requires_grad)
                 for k, v in named.items()}
    total = 0
    for inputs, targets in batches:
        fake_in, fake_targets = (map_tensors(x, mode.from_tensor) for x in (inputs, targets))
        with mode, FlopCounterMode(display=False, custom_mapping=cpu_attention()) as counter:
            loss = loss_fn(_call(lambda *a, **k: functional_call(model, state, a, k), fake_in), fake_targets)
            loss.backward()
        total += counter.get_total_flops()
    return float(total)


def cpu_attention() -> dict[Any, Any]:
    """SDPA's CPU kernels, which FlopCounterMode (torch 2.11-2.13) does not count: without them a CPU
    count leaves attention out. Counted with torch's own formulas for the CUDA kernels, whose leading
    arguments are the same (query, key, value; grad_out before them in backward)."""
    from torch.utils import flop_counter

    def forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return flop_counter.sdpa_backward_flop_count(grad, query, key, value)

    aten = torch.ops.aten
    if not hasattr(flop_counter, "sdpa_flop_count") or not hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return {}
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def estimated_flops_per_token(model: nn.Module, seq_len: float) -> float:
    """Fallback when counting fails: 6 N for the weights plus the attention scores (PaLM appendix B)."""
    from autocompile.workload.models import flops_per_token

    return flops_per_token(model, seq_len)


def flops_per_item(build: Callable[[], nn.Module], loss_fn: Callable[[Any, Any], torch.Tensor],
                   batches: list[tuple[Any, Any]], items: int, device: torch.device) -> float | None:
    """Counted FLOPs per item (token or image) over ``batches``; None when the model cannot run on fake
    tensors (the reason is logged)."""
    try:
        return step_flops(build, loss_fn, batches, device) / items
    except Exception as exc:  # noqa: BLE001 (user models: any failure means "not countable")
        log.warning("FLOPs not counted (%s: %s); MFU uses the 6N estimate", type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")
        return None
