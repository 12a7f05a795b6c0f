"""Synthetic token batches: the same numbers for every trial with the same seed."""

from __future__ import annotations

import torch


class SyntheticTokens:
    """Step ``i`` yields ``(inputs, targets)`` of length ``seq_lens[i % len(seq_lens)]``.

    Each (seed, rank, step) has its own generator, so a batch never depends on what ran before:
    trials that warm up differently still train on identical data at the same step.

    Token ids come from a small part of the vocabulary (``active_vocab``), so even a short burst
    learns something (their frequency): per-step losses fall measurably, and a step that does not
    really train (no update, wrong gradients) drifts from the eager baseline by far more than the
    study's loss tolerance (``scripts/loss_signal.py``). Uniform ids over the whole vocabulary left
    the loss flat, so such a step passed.
    """

    def __init__(self, vocab_size: int, batch_size: int, seq_lens: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu") -> None:
        self.vocab_size = vocab_size
        self.active_vocab = min(256, max(2, vocab_size // 4))
        self.batch_size = batch_size
        self.seq_lens = list(seq_lens)
        self.seed = seed
        self.rank = rank
        self.device = torch.device(device)

    def seq_len(self, step: int) -> int:
        return self.seq_lens[step % len(self.seq_lens)]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(hash((self.seed, self.rank, step)) & 0x7FFF_FFFF)
        # One extra token so that targets are inputs shifted by one.
        ids = torch.randint(0, self.active_vocab, (self.batch_size, self.seq_len(step) + 1), generator=gen)
        ids = ids.to(self.device, non_blocking=True)
        return ids[:, :-1], ids[:, 1:]

    def tokens(self, step: int) -> int:
        return self.batch_size * self.seq_len(step)
