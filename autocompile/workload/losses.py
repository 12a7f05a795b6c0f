"""Shipped losses: ``loss(output, targets)`` returns a scalar tensor (``workload.loss``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from autocompile.workload.data import IGNORE_INDEX


def logits_of(output: Any) -> torch.Tensor:
    """Logits of a model output: the tensor itself or its ``.logits`` (Hugging Face outputs)."""
    return output.logits if hasattr(output, "logits") else output


def cross_entropy(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension of the logits, for every family: next-token (batch, seq,
    vocab), masked LM (targets -100 where nothing is predicted) and classification (batch, classes)."""
    logits = logits_of(output)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


lm_loss = cross_entropy
"""The name the first versions exported (next-token cross-entropy)."""


def model_loss(output: Any, targets: Any = None) -> torch.Tensor:
    """The loss the model computed itself (``output.loss``: a Hugging Face model given ``labels`` in its inputs)."""
    loss = getattr(output, "loss", None)
    if loss is None:
        raise ValueError("workload.loss is model_loss but the model output has no .loss: put the labels in the "
                         "inputs (a dict with 'labels') or use autocompile.workload.losses.cross_entropy")
    return loss
