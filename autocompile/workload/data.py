"""Synthetic batches: the same numbers for every trial with the same seed.

A data part (``workload.data``) is called with a step index and returns ``(inputs, targets)``;
inputs are a tensor, a tuple of tensors (positional arguments) or a dict (keyword arguments, as
Hugging Face models take ``input_ids`` and ``attention_mask``). Each (seed, rank, step) has its own
generator, so a batch never depends on what ran before: trials that warm up differently still
train on identical data at the same step. The timing workers call a data part before the warm-up only,
for a ring of batches kept on the device (:func:`autocompile.trial.program.build.stage`): nothing is generated
or copied from the host while steps are timed.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100
"""Targets ignored by ``cross_entropy`` (positions a masked LM does not predict)."""


def _generator(seed: int, rank: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash((seed, rank, step)) & 0x7FFF_FFFF)


class SyntheticTokens:
    """Causal LM data: step ``i`` yields ``(inputs, targets)`` of length ``seq_len[i % len(seq_len)]``,
    targets being the inputs shifted by one.

    Token ids come from a small part of the vocabulary (``active_vocab``), so even a short burst
    learns something (their frequency): per-step losses fall measurably, and a step that does not
    really train (no update, wrong gradients) drifts from the eager baseline by far more than the
    study's loss tolerance (``benchmarks/recipes/loss_signal.py``). Uniform ids over the whole vocabulary left
    the loss flat, so such a step passed.
    """

    def __init__(self, vocab_size: int, batch_size: int, seq_len: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu") -> None:
        self.vocab_size = vocab_size
        self.active_vocab = min(256, max(2, vocab_size // 4))
        self.batch_size = batch_size
        self.seq_lens = list(seq_len)
        self.seed = seed
        self.rank = rank
        self.device = torch.device(device)

    def seq_len(self, step: int) -> int:
        return self.seq_lens[step % len(self.seq_lens)]

    def ids(self, step: int, extra: int = 0) -> torch.Tensor:
        gen = _generator(self.seed, self.rank, step)
        return torch.randint(0, self.active_vocab, (self.batch_size, self.seq_len(step) + extra), generator=gen)

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        ids = self.ids(step, extra=1).to(self.device, non_blocking=True)  # one extra token: targets are shifted
        return ids[:, :-1], ids[:, 1:]

    __call__ = batch

    def tokens(self, step: int) -> int:
        return self.batch_size * self.seq_len(step)


class SyntheticMaskedTokens(SyntheticTokens):
    """Masked LM data (BERT): ``({"input_ids", "attention_mask"}, labels)``; a fixed share of the
    positions is replaced by ``mask_token_id`` and only those are predicted (the rest are -100)."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu", mask_prob: float = 0.15, mask_token_id: int | None = None) -> None:
        super().__init__(vocab_size, batch_size, seq_len, seed, rank, device)
        if not 0 < mask_prob < 1:
            raise ValueError(f"workload.data.mask_prob={mask_prob} must be in (0, 1), e.g. 0.15")
        self.mask_prob = mask_prob
        # Outside the active ids, so a masked position never shows its answer.
        self.mask_token_id = vocab_size - 1 if mask_token_id is None else mask_token_id

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        ids = self.ids(step)
        gen = _generator(self.seed + 1, self.rank, step)
        masked = torch.rand(ids.shape, generator=gen) < self.mask_prob
        labels = torch.where(masked, ids, torch.full_like(ids, IGNORE_INDEX))
        inputs = {"input_ids": torch.where(masked, torch.full_like(ids, self.mask_token_id), ids),
                  "attention_mask": torch.ones_like(ids)}
        return ({k: v.to(self.device, non_blocking=True) for k, v in inputs.items()},
                labels.to(self.device, non_blocking=True))

    __call__ = batch


class SyntheticImages:
    """Image classification data: ``({"pixel_values": (batch, channels, size, size)}, labels)``.

    Labels come from a few classes and each class shifts the pixels by its own offset, so a short
    burst learns (the loss falls) whatever the model."""

    def __init__(self, batch_size: int, seed: int, rank: int = 0, device: str | torch.device = "cpu",
                 image_size: int = 224, num_channels: int = 3, num_labels: int = 1000, input_name: str = "pixel_values",
                 ) -> None:
        self.batch_size = batch_size
        self.image_size = image_size
        self.num_channels = num_channels
        self.active_labels = min(num_labels, 4)
        self.seed = seed
        self.rank = rank
        self.device = torch.device(device)
        self.input_name = input_name

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        gen = _generator(self.seed, self.rank, step)
        labels = torch.randint(0, self.active_labels, (self.batch_size,), generator=gen)
        shape = (self.batch_size, self.num_channels, self.image_size, self.image_size)
        pixels = torch.randn(shape, generator=gen) + labels.view(-1, 1, 1, 1).float()
        inputs = pixels.to(self.device, non_blocking=True)
        return ({self.input_name: inputs} if self.input_name else inputs), labels.to(self.device, non_blocking=True)

    __call__ = batch

    def tokens(self, step: int) -> int:
        return self.batch_size  # images: throughput is images/s


def item_unit(inputs: Any) -> str:
    """What ``count_items`` counts: token ids (an integer first input) or samples (images, features)."""
    return "samples" if _first_tensor(inputs).is_floating_point() else "tokens"


def rate_label(results: Any) -> str:
    """"tokens/s" or "samples/s" for results that carry ``throughput_unit``: one or several, as dicts or as
    records with the attribute; results from before the unit was recorded were tokens."""
    one = isinstance(results, dict) or hasattr(results, "throughput_unit")
    units = {(r.get("throughput_unit") if isinstance(r, dict) else r.throughput_unit) or "tokens"
             for r in ([results] if one else list(results)) if r}
    return f"{units.pop()}/s" if len(units) == 1 else "items/s"


def _first_tensor(inputs: Any) -> torch.Tensor:
    if isinstance(inputs, dict):
        first = inputs.get("input_ids", next(iter(inputs.values())))
    elif isinstance(inputs, (tuple, list)):
        first = inputs[0]
    else:
        first = inputs
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"the data's inputs hold a {type(first).__name__}, not a tensor")
    return first


def count_items(inputs: Any) -> int:
    """What a step processes, for throughput when the data part does not say (``tokens(step)``): the
    token ids (an integer tensor's elements, ``input_ids`` of a dict), else the batch size."""
    first = _first_tensor(inputs)
    return first.numel() if not first.is_floating_point() else first.shape[0]


def map_tensors(value: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor in a tensor, tuple, list or dict."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value
