"""Shipped losses: ``loss(output, targets)`` returns a scalar tensor (``workload.loss``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from autocompile.workload.data import IGNORE_INDEX


def logits_of(output: Any) -> torch.Tensor:
    """Logits of a model output: the tensor itself, its ``.logits`` (Hugging Face outputs) or the first
    element of a tuple (minGPT/nanoGPT's ``(logits, loss)``)."""
    if hasattr(output, "logits"):
        return output.logits
    return output[0] if isinstance(output, (tuple, list)) else output


def own_loss(output: Any) -> torch.Tensor | None:
    """The loss the model computed itself, or None: ``output.loss`` (Hugging Face, given labels) or the
    scalar tensor of a ``(logits, loss)`` tuple (minGPT/nanoGPT, given targets)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)):
        loss = next((x for x in output[1:] if isinstance(x, torch.Tensor) and x.dim() == 0), None)
    return loss


def cross_entropy(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension of the logits, for every family: next-token (batch, seq,
    vocab), masked LM (targets -100 where nothing is predicted) and classification (batch, classes).
    A model that was handed the targets and returned its own loss is not charged a second one: its
    loss is the one its training loop backpropagates."""
    loss = own_loss(output)
    if loss is not None:
        return loss
    logits = logits_of(output)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


lm_loss = cross_entropy
"""The name the first versions exported (next-token cross-entropy)."""


def model_loss(output: Any, targets: Any = None) -> torch.Tensor:
    """The loss the model computed itself (``output.loss``: a Hugging Face model given ``labels`` in its inputs)."""
    loss = own_loss(output)
    if loss is None:
        raise ValueError("workload.loss is model_loss but the model output has no .loss: put the labels in the "
                         "inputs (a dict with 'labels') or use autocompile.workload.losses.cross_entropy")
    return loss
