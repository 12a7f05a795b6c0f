"""A user's own parts, named by dotted path like any ``_target_``: data, loss, optimizer, schedule."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def batches(step: int, batch_size: int, seq_len: list[int], seed: int, vocab_size: int,
            device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A data function: step -> (token ids, next tokens), ids from a quarter of the vocabulary."""
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    ids = torch.randint(0, max(2, vocab_size // 4), (batch_size, seq_len[step % len(seq_len)] + 1), generator=gen)
    ids = ids.to(device)
    return ids[:, :-1], ids[:, 1:]


def smoothed_loss(output: Any, targets: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """A loss function with an argument of its own (bound from the config)."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), label_smoothing=smoothing)


def sgd(params: Any, lr: float = 0.05, momentum: float = 0.9, **impl: Any) -> torch.optim.Optimizer:
    """An optimizer factory: completed with the parameters (and the optim.impl arguments)."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, **impl)


def warmup(optimizer: torch.optim.Optimizer, steps: int = 4) -> torch.optim.lr_scheduler.LRScheduler:
    """A schedule factory: linear warm-up to the optimizer's LR over ``steps`` optimizer steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / steps))


def curriculum_batches(step: int, batch_size: int, seq_len: list[int], seed: int, vocab_size: int,
                       device: Any = "cpu", longer_from: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A curriculum the workload does not declare: sequences twice as long from step ``longer_from`` on, which
    the warm-up (the first steps) never sees."""
    length = seq_len[0] * (2 if step >= longer_from else 1)
    return batches(step, batch_size, [length], seed, vocab_size, device)



def changing_batches(step: int, batch_size: int, seq_len: list[int], seed: int, vocab_size: int,
                     device: Any = "cpu", change_at: tuple[int, ...] = (3,)) -> tuple[torch.Tensor, torch.Tensor]:
    """Batches that change at each step of ``change_at``, each change a recompile whatever automatic dynamic marked
    before it: the sequences grow, then the batch, then the ids become int32 (``tests/test_timing_core.py``)."""
    changes = sum(step >= c for c in change_at)
    inputs, targets = batches(step, batch_size + (changes >= 2), [seq_len[0] + 4 * (changes >= 1)], seed, vocab_size,
                              device)
    return (inputs.int() if changes >= 3 else inputs), targets
