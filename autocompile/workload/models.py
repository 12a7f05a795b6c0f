"""Model factories: GPT-2, Llama, BERT and ViT (Hugging Face transformers, random init, no download).

A model for autocompile is any ``nn.Module`` the data's inputs are fed to (a tensor, a tuple of
positional arguments or a dict of keyword arguments) whose output the loss takes (logits, or an
output with ``.logits``); factories are named by dotted path, like a Hydra ``_target_``, so user
models plug in without registering anything. Every shipped factory builds for training:
``use_cache=False`` (a cache object per block makes dynamo recompile per block) and, where a
family has it, the loss type set so that no warning breaks the graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from autocompile.workload.parts import import_target


def gpt2(
    n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50257, n_positions: int = 1024,
    dropout: float = 0.0, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``GPT2LMHeadModel``, randomly initialised (no download); defaults are GPT-2 124M.
    Further ``GPT2Config`` fields pass through (``+model.n_inner=2048``).

    ``use_cache=False``: with a cache object per block, dynamo guards on it and recompiles per
    block, so regional compile hits the recompile limit. ``loss_type`` is set because passing
    ``labels`` would log a warning that breaks the graph; autocompile computes the loss outside.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, n_positions=n_positions,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False,
        bos_token_id=0, eos_token_id=0, **config_fields,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def llama(
    num_hidden_layers: int = 16, hidden_size: int = 2048, num_attention_heads: int = 32, num_key_value_heads: int = 8,
    intermediate_size: int = 8192, vocab_size: int = 128256, max_position_embeddings: int = 2048,
    **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``LlamaForCausalLM``; defaults are Llama-3.2-1B's shape (untied here: tying is a config field)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=num_hidden_layers, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size, vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings, use_cache=False, **config_fields)
    model = LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model


def bert(
    num_hidden_layers: int = 12, hidden_size: int = 768, num_attention_heads: int = 12, intermediate_size: int = 3072,
    vocab_size: int = 30522, max_position_embeddings: int = 512, dropout: float = 0.0, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``BertForMaskedLM``; defaults are BERT-base. Dropout 0 by default: every trial then
    computes the same numbers, so losses can be compared with the eager reference."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        num_hidden_layers=num_hidden_layers, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size, vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, use_cache=False, **config_fields)
    return BertForMaskedLM(config)


def vit(
    num_hidden_layers: int = 12, hidden_size: int = 768, num_attention_heads: int = 12, intermediate_size: int = 3072,
    image_size: int = 224, patch_size: int = 16, num_channels: int = 3, num_labels: int = 1000, **config_fields: Any,
) -> nn.Module:
    """Hugging Face ``ViTForImageClassification``; defaults are ViT-B/16 at 224 pixels, 1000 classes."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        num_hidden_layers=num_hidden_layers, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size, image_size=image_size, patch_size=patch_size, num_channels=num_channels,
        num_labels=num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **config_fields)
    return ViTForImageClassification(config)


def _config_fields(config_class: str) -> Callable[[], set[str]]:
    def fields() -> set[str]:
        import transformers

        return set(getattr(transformers, config_class)().to_dict())

    return fields


def _gpt2_config_fields() -> set[str]:
    from transformers import GPT2Config

    return set(GPT2Config().to_dict())


# GPT2Config keeps any keyword, so a misspelled field would silently measure the default model.
gpt2.accepts = _gpt2_config_fields  # type: ignore[attr-defined]
llama.accepts = _config_fields("LlamaConfig")  # type: ignore[attr-defined]
bert.accepts = _config_fields("BertConfig")  # type: ignore[attr-defined]
vit.accepts = _config_fields("ViTConfig")  # type: ignore[attr-defined]


def resolve(target: str) -> Callable[..., nn.Module]:
    """Import ``pkg.module.factory``; the error names the path that failed and why."""
    factory = import_target(target, "model", ImportError)
    if not callable(factory):
        raise ImportError(f"model._target_={target!r} is not callable")
    return factory


def factory_kwargs(target: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments the factory takes: ``vocab_size`` (the data's) only if it has such a parameter;
    any other argument it does not take is an error now, not in every trial."""
    factory = resolve(target)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C extension: pass everything
        return kwargs
    named = set(params)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        if not hasattr(factory, "accepts") or set(kwargs) <= named:
            return kwargs
        named |= factory.accepts()  # the keywords it passes on, where it says which
    p_kw = inspect.Parameter.VAR_KEYWORD
    taken = {k: v for k, v in kwargs.items() if k in named or k != "vocab_size"}
    unknown = sorted(set(taken) - named)
    if unknown:
        raise ValueError(f"model._target_={target!r} takes no argument {unknown[0]!r}: drop model.{unknown[0]} "
                         f"(it takes {', '.join(p for p in params if params[p].kind != p_kw) or 'no arguments'}"
                         f"{' and further config fields' if len(named) > len(params) else ''})")
    return taken


def build(target: str, kwargs: dict[str, Any]) -> nn.Module:
    model = resolve(target)(**factory_kwargs(target, kwargs))
    if not isinstance(model, nn.Module):
        raise TypeError(f"model._target_={target!r} returned {type(model).__name__}, not an nn.Module")
    return model


def flops_per_token(model: nn.Module, seq_len: float) -> float:
    """Training FLOPs per token: 6 N for the weights plus the attention scores (PaLM appendix B).

    Embedding lookups do no FLOPs, so position embeddings are left out of N; the attention
    term needs the layer count and width, read from a Hugging Face style ``config`` when present.
    """
    n_params = sum(p.numel() for p in model.parameters())
    config = getattr(model, "config", None)
    wpe = getattr(getattr(model, "transformer", None), "wpe", None)
    if isinstance(wpe, nn.Embedding):
        n_params -= wpe.weight.numel()
    attention = 0.0
    if config is not None and hasattr(config, "n_layer") and hasattr(config, "n_embd"):
        attention = 12.0 * config.n_layer * config.n_embd * seq_len
    return 6.0 * n_params + attention
