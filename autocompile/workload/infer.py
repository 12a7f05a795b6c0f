"""What the data needs to know about the model, read from the model itself.

``vocab_size`` comes from the input embedding (``get_input_embeddings()`` of a Hugging Face model,
else the first ``nn.Embedding``); image facts from a Hugging Face ``config`` or the first
convolution; the kind of data (``data_kind``) from the forward's arguments and the model's layers.
A fact that cannot be read is absent, and the data part that needs it asks for it in one line
(``parts.need_message``). Torch only: the worker runs this.
"""

from __future__ import annotations

import inspect
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
    kind = data_kind(model, embedding)
    if kind is not None:
        facts["data_kind"] = kind
    start = getattr(config, "decoder_start_token_id", None)
    if kind == "seq2seq" and isinstance(start, int):
        facts["decoder_start_token_id"] = start
    params = forward_parameters(model)
    labels = params.get("labels")
    if labels is not None and labels.default is inspect.Parameter.empty:
        facts["labels_required"] = True
    elif labels is None and "targets" in params:
        # minGPT/nanoGPT's forward(idx, targets=None): given targets it returns (logits, loss) over every
        # position; without them only the last position's logits (an inference shortcut). Its training
        # loop passes them, so the data does too and the loss is the model's own (losses.cross_entropy).
        facts["labels_required"] = True
        facts["labels_name"] = "targets"
    return facts


DATA_KINDS = ("tokens", "masked_tokens", "seq2seq", "images")
"""What ``data_kind`` says: token ids (causal LM), masked token ids, source and decoder ids, images."""


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def data_kind(model: nn.Module, embedding: nn.Embedding | None = None) -> str | None:
    """The kind of data the model takes (one of ``DATA_KINDS``), or None when it cannot be read.

    By the forward's argument names first (Hugging Face names them: ``decoder_input_ids`` for an
    encoder-decoder, ``pixel_values`` for images, both together is a model that wants both and is
    left to the user), then by the layers: an input embedding (or an ``input_ids`` argument) takes
    token ids (masked ones for a ``...ForMaskedLM``), a convolution without one takes images."""
    params = forward_parameters(model)
    images, decoder = "pixel_values" in params, "decoder_input_ids" in params
    if images and ("input_ids" in params or decoder):
        return None
    if decoder:
        return "seq2seq"
    if images:
        return "images"
    embedding = embedding if embedding is not None else input_embedding(model)
    if embedding is not None:
        return "masked_tokens" if type(model).__name__.endswith("ForMaskedLM") else "tokens"
    if "input_ids" in params:
        return "tokens"
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        return "images"
    return None
