"""Model factories beyond decoder LMs: an encoder-decoder (T5), a mixture of experts (Mixtral) and a
convolutional network (ResNet), Hugging Face transformers classes, random init, no download.

Each is where ``torch.compile`` behaves differently from a decoder LM: T5 ties one embedding to both
stacks and the head (regional compile must compile it where it is called), Mixtral routes tokens to
experts by data, ResNet is convolutions and BatchNorm (running statistics updated in the forward).
Kept apart from ``models.py`` so that the study identity of the first four families (a hash of their
factory's source file) does not change when these do.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from autocompile.workload.models import _config_fields


def t5(
    num_layers: int = 12, d_model: int = 768, d_ff: int = 3072, num_heads: int = 12, d_kv: int = 64,
    vocab_size: int = 32128, dropout: float = 0.0, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``T5ForConditionalGeneration``; defaults are T5-base (220M).

    Blocks: ``encoder.block.*`` and ``decoder.block.*`` (``T5Block``, self-attention, cross-attention in
    the decoder, ReLU MLP); the rest is the ``shared`` embedding, tied to ``encoder.embed_tokens``,
    ``decoder.embed_tokens`` and ``lm_head``, and the two final norms. Data: source token ids, decoder
    input ids (the targets shifted right behind ``decoder_start_token_id``) and targets
    (``data.SyntheticSeq2Seq``); the loss is the shipped cross-entropy on the logits (``model_loss``
    works too, with ``+workload.data.labels_in_inputs=true``). ``num_decoder_layers`` defaults to
    ``num_layers``; ``use_cache=False`` as for every shipped family; dropout 0 so trials compute the
    same numbers.
    """
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        num_layers=num_layers, d_model=d_model, d_ff=d_ff, num_heads=num_heads, d_kv=d_kv, vocab_size=vocab_size,
        dropout_rate=dropout, use_cache=False, **{"decoder_start_token_id": 0, **config_fields})
    return T5ForConditionalGeneration(config)


def mixtral(
    num_hidden_layers: int = 16, hidden_size: int = 1024, intermediate_size: int = 3584,
    num_attention_heads: int = 16, num_key_value_heads: int = 4, num_local_experts: int = 8,
    num_experts_per_tok: int = 2, vocab_size: int = 32000, max_position_embeddings: int = 2048,
    experts_implementation: str | None = None, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``MixtralForCausalLM``: defaults are Mixtral-8x7B's design (8 SwiGLU experts, top-2
    routing, 4 query heads per key-value head, its vocabulary) at a quarter of its width and half its
    depth, 1.5B parameters of which 0.46B are active per token, so that it trains on one GPU (Mixtral
    itself: ``num_hidden_layers=32 hidden_size=4096 intermediate_size=14336 num_attention_heads=32
    num_key_value_heads=8``).

    Blocks: ``model.layers.*`` (``MixtralDecoderLayer``: attention, then the router and the experts,
    whose weights are two stacked tensors). Data: token ids, next-token targets. The experts run as
    ``experts_implementation`` says, by default transformers' own choice (``grouped_mm`` in transformers 5:
    no data-dependent shapes, so no graph break at the routing); ``eager`` is the per-expert loop.
    No router auxiliary loss (``output_router_logits`` stays off): the step's loss is the LM loss.
    """
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        num_hidden_layers=num_hidden_layers, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        num_local_experts=num_local_experts, num_experts_per_tok=num_experts_per_tok, vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings, use_cache=False,
        **({"experts_implementation": experts_implementation} if experts_implementation else {}), **config_fields)
    model = MixtralForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model


def resnet(
    embedding_size: int = 64, hidden_sizes: tuple[int, ...] = (256, 512, 1024, 2048),
    depths: tuple[int, ...] = (3, 4, 6, 3), layer_type: str = "bottleneck", image_size: int = 224,
    num_channels: int = 3, num_labels: int = 1000, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``ResNetForImageClassification``; defaults are ResNet-50 on 224-pixel ImageNet images.

    Blocks: the stages ``resnet.encoder.stages.*`` (``ResNetStage``, each a sequence of residual
    layers of convolution, BatchNorm and ReLU; every stage has its own widths, so each compiles its
    own graph); the rest is the stem (``resnet.embedder``) and the ``classifier``. Data: images
    (``{"pixel_values"}``) and class labels (``data.SyntheticImages``); ``image_size`` is kept on the
    config (ResNet's has none) so the data reads it from the model.
    """
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        embedding_size=embedding_size, hidden_sizes=list(hidden_sizes), depths=list(depths), layer_type=layer_type,
        num_channels=num_channels, num_labels=num_labels, image_size=image_size, **config_fields)
    return ResNetForImageClassification(config)


# The config classes keep any keyword, so a misspelled field would silently measure the default model.
t5.accepts = _config_fields("T5Config")  # type: ignore[attr-defined]
mixtral.accepts = _config_fields("MixtralConfig")  # type: ignore[attr-defined]
resnet.accepts = _config_fields("ResNetConfig")  # type: ignore[attr-defined]
