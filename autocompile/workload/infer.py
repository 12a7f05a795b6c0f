"""What the data needs to know about the model, read from the model itself.

``vocab_size`` comes from the input embedding (``get_input_embeddings()`` of a Hugging Face model,
else the first ``nn.Embedding``); image facts from a Hugging Face ``config`` or the first
convolution; the kind of data (``data_kind``) from the forward's arguments and the model's layers, and
what else the data must give to follow the forward's signature (``model_inputs``: the inputs it takes,
images by keyword or positionally, an audio model's feature shape, a vision-language model's image tokens).
A fact that cannot be read is absent, and the data part that needs it asks for it in one line
(``parts.need_message``). Torch only: the worker runs this.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, TypedDict

from torch import nn


class ModelFacts(TypedDict, total=False):
    """What the model says about the data it takes (``model_facts``; ``input_facts`` the keys from
    ``model_inputs`` down). A fact that cannot be read is absent."""

    vocab_size: int
    """Token ids are drawn from ``[0, vocab_size)``: the input embedding's rows, or a CTC head's tokens."""
    image_size: int
    num_channels: int
    num_labels: int
    data_kind: str
    """One of ``DATA_KINDS``."""
    decoder_start_token_id: int
    """An encoder-decoder's first decoder id (seq2seq and speech_seq2seq only)."""
    labels_required: bool
    """The forward takes the labels (required ``labels``, or minGPT's ``targets``): the data puts them in the inputs."""
    labels_name: str
    """The name the labels go under when not ``labels`` (``targets``)."""
    model_inputs: tuple[str, ...]
    """The forward's arguments the data must give (``model_inputs()``); always present."""
    first_input: str
    """The forward's first argument: a tensor alone goes there; always present ("" without one)."""
    image_input: str
    """``pixel_values`` when images go by that keyword, "" when positionally; always present."""
    num_mel_bins: int
    feature_frames: int
    """Whisper's input frames: ``max_source_positions`` times the encoder's convolution strides."""
    conv_kernel: tuple[int, ...]
    """A wav2vec2 feature encoder's kernels, one per layer (with ``conv_stride``)."""
    conv_stride: tuple[int, ...]
    audio_targets: str
    """``ctc`` (a ``...ForCTC``) or ``classes``: what a raw-audio model's labels are."""
    max_text_len: int
    """Positions of the text tower or decoder: longer text is cut to this."""
    image_token_id: int
    """LLaVA's image token in the text (with ``image_tokens``, the tokens per image)."""
    image_tokens: int


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


def model_facts(model: nn.Module) -> ModelFacts:
    """``vocab_size``, ``image_size``, ``num_channels``, ``num_labels``: those the model says."""
    facts: ModelFacts = {}
    embedding = input_embedding(model)
    if embedding is not None:
        facts["vocab_size"] = embedding.num_embeddings
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)  # CLIP, LLaVA: the image facts are the vision tower's
    for name in ("image_size", "num_channels", "num_labels"):
        value = getattr(config, name, None)
        if value is None and name != "num_labels":
            value = getattr(vision, name, None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int):
            facts[name] = value  # type: ignore[literal-required]
    if "num_channels" not in facts and embedding is None:
        conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
        if conv is not None:
            facts["num_channels"] = conv.in_channels
    kind = data_kind(model, embedding)
    if kind is not None:
        facts["data_kind"] = kind
    facts.update(input_facts(model))
    start = getattr(config, "decoder_start_token_id", None)
    if kind in ("seq2seq", "speech_seq2seq") and isinstance(start, int):
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


DATA_KINDS = ("tokens", "masked_tokens", "seq2seq", "images", "speech_seq2seq", "speech", "audio", "image_text",
              "vision_language")
"""What ``data_kind`` says: token ids (causal LM), masked token ids, source and decoder ids, images, audio features
with decoder ids (Whisper), audio features with classes, raw audio (wav2vec2), image-text pairs (CLIP), images in a
text (LLaVA)."""

MODALITIES = ("input_ids", "decoder_input_ids", "pixel_values", "pixel_values_videos", "input_features",
              "input_values", "sample", "timestep", "encoder_hidden_states")
"""Forward arguments that carry the data: a model that takes one of them trains on it, so the data must give it
(``encoder_hidden_states`` only beside ``sample`` and ``timestep``: a diffusion UNet's text conditioning; a
decoder LM's is optional cross-attention)."""

KIND_INPUTS = {"tokens": ("input_ids",), "masked_tokens": ("input_ids",), "seq2seq": ("input_ids", "decoder_input_ids"),
               "images": ("pixel_values",), "speech_seq2seq": ("input_features", "decoder_input_ids"),
               "speech": ("input_features",), "audio": ("input_values",), "image_text": ("input_ids", "pixel_values"),
               "vision_language": ("input_ids", "pixel_values")}
"""The forward arguments each kind's data gives (a tensor alone goes to the forward's first argument)."""


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def model_inputs(params: dict[str, inspect.Parameter]) -> tuple[str, ...]:
    """The inputs a forward takes that the data must give: its data arguments (``MODALITIES``) and every
    argument without a default (but the labels, which the data gives when required)."""
    unet = "sample" in params and "timestep" in params
    wanted = [n for n in params if n in MODALITIES and (n != "encoder_hidden_states" or unet)]
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in ("self", "labels")
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "targets"]
    return tuple(wanted + [n for n in required if n not in wanted])


def input_facts(model: nn.Module) -> ModelFacts:
    """What the data needs to follow the forward's signature: ``model_inputs`` and ``first_input`` (a tensor alone
    goes there), ``image_input`` (``pixel_values`` when images go by that keyword, "" when positionally: a
    torchvision or timm ``forward(x)``), and per modality the shapes the model's config fixes: Whisper's
    ``num_mel_bins`` and ``feature_frames``, a wav2vec2 feature encoder's ``conv_kernel`` and ``conv_stride``, the
    ``max_text_len`` of a text tower or decoder, LLaVA's ``image_token_id`` and ``image_tokens`` per image."""
    params = forward_parameters(model)
    facts: ModelFacts = {"model_inputs": model_inputs(params), "first_input": next(iter(params), ""),
                             "image_input": "pixel_values" if "pixel_values" in params else ""}
    config = getattr(model, "config", None)
    mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    if "input_features" in params and isinstance(mels, int) and isinstance(positions, int):
        encoder = model.get_encoder() if callable(getattr(model, "get_encoder", None)) else model
        strides = [m.stride[0] for m in encoder.modules() if isinstance(m, nn.Conv1d)] or [2]
        facts["num_mel_bins"], facts["feature_frames"] = mels, positions * math.prod(strides)
    kernel, stride = getattr(config, "conv_kernel", None), getattr(config, "conv_stride", None)
    if "input_values" in params and kernel and stride:
        facts["conv_kernel"], facts["conv_stride"] = tuple(kernel), tuple(stride)
        facts["audio_targets"] = "ctc" if type(model).__name__.endswith("ForCTC") else "classes"
        if facts["audio_targets"] == "ctc" and isinstance(getattr(config, "vocab_size", None), int):
            facts["vocab_size"] = config.vocab_size  # the CTC head's tokens (wav2vec2 has no input embedding)
    text = getattr(config, "text_config", config)
    limit = getattr(text, "max_target_positions" if "decoder_input_ids" in params else "max_position_embeddings", None)
    if isinstance(limit, int):
        facts["max_text_len"] = limit
    tokens = image_tokens(config)
    if tokens:
        facts["image_token_id"], facts["image_tokens"] = tokens
    return facts


def image_tokens(config: Any) -> tuple[int, int] | None:
    """(image token id, tokens per image) of a LLaVA-style model: one image of ``vision_config.image_size`` makes
    (size / patch)² patch features, plus the CLS feature under ``vision_feature_select_strategy="full"``, each
    taking the place of one image token in the text (transformers' ``LlavaProcessor`` counts them so). None for
    any other model, and for one that tiles its images (LLaVA-NeXT's ``image_grid_pinpoints``): its count is not
    this one."""
    vision = getattr(config, "vision_config", None)
    token = getattr(config, "image_token_id", getattr(config, "image_token_index", None))
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    strategy = getattr(config, "vision_feature_select_strategy", None)
    if (not isinstance(token, int) or not isinstance(size, int) or not isinstance(patch, int)
            or strategy not in ("default", "full") or getattr(config, "image_grid_pinpoints", None)):
        return None
    return token, (size // patch) ** 2 + (strategy == "full")


def data_kind(model: nn.Module, embedding: nn.Embedding | None = None) -> str | None:
    """The kind of data the model takes (one of ``DATA_KINDS``), or None when it cannot be read or made.

    By the forward's argument names first (Hugging Face names them: ``input_features`` for audio features,
    Whisper's with ``decoder_input_ids``; ``input_values`` for raw audio; ``pixel_values`` with ``input_ids``
    for image-text pairs when the forward has CLIP's ``return_loss``, images in a text when the config says
    where they go (``image_tokens``), else left to the user; ``decoder_input_ids`` for an encoder-decoder,
    ``pixel_values`` for images; a diffusion UNet's ``sample`` and ``timestep`` are left to the user), then
    by the layers: an input embedding (or an ``input_ids`` argument) takes token ids (masked ones for a
    ``...ForMaskedLM``), a convolution without one takes images."""
    params = forward_parameters(model)
    images, decoder = "pixel_values" in params, "decoder_input_ids" in params
    facts = input_facts(model)
    if "sample" in params and "timestep" in params:
        return None
    if "input_features" in params:
        return None if "num_mel_bins" not in facts else "speech_seq2seq" if decoder else "speech"
    if "input_values" in params:
        return "audio" if "conv_stride" in facts else None
    if images and "input_ids" in params:
        if "return_loss" in params:
            return "image_text"
        return "vision_language" if "image_tokens" in facts else None
    if images and decoder:
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
