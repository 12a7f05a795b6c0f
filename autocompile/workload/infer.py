"""What the data needs to know about the model, read from the model itself.

``vocab_size`` comes from the input embedding (``get_input_embeddings()`` of a Hugging Face model,
else the first ``nn.Embedding``); image facts from a Hugging Face ``config`` or the first
convolution. A fact that cannot be read is absent, and the data part that needs it asks for it in
one line (``parts.need_message``). Torch only: the worker runs this.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def input_embedding(model: nn.Module) -> nn.Embedding | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            found = get()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Embedding):
            return found
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def model_facts(model: nn.Module) -> dict[str, Any]:
    """``vocab_size``, ``image_size``, ``num_channels``, ``num_labels``: those the model says."""
    facts: dict[str, Any] = {}
    embedding = input_embedding(model)
    if embedding is not None:
        facts["vocab_size"] = embedding.num_embeddings
    config = getattr(model, "config", None)
    for name in ("image_size", "num_channels", "num_labels"):
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int):
            facts[name] = value
    if "num_channels" not in facts and embedding is None:
        conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
        if conv is not None:
            facts["num_channels"] = conv.in_channels
    return facts
