"""nanoGPT's own GPT (``examples/nanogpt/model.py``, unchanged) at the size issue 26 measured it: a factory for
``+model=custom model._target_=examples.models.nanogpt.tiny``.

2 layers, 2 heads, n_embd 64, 128-token context, and the 65-character vocabulary of nanoGPT's
``shakespeare_char`` example; no dropout and biases as nanoGPT's defaults. Its ``forward(idx, targets=None)``
returns ``(logits, None)`` without targets: autocompile's loss reads the logits from the tuple.
"""

from __future__ import annotations

from examples.nanogpt.model import GPT, GPTConfig


def tiny(n_layer: int = 2, n_head: int = 2, n_embd: int = 64, block_size: int = 128, vocab_size: int = 65) -> GPT:
    """nanoGPT's GPT at issue 26's size."""
    return GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                         vocab_size=vocab_size, dropout=0.0, bias=True))
