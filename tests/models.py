"""Model factories for tests, named by dotted path like any user model (``_target_``)."""

from __future__ import annotations

import os
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, sleep_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            # A known cost per forward call, twenty times higher under autocast: a configuration
            # that is clearly slower, whatever the noise of a busy test machine.
            time.sleep(self.sleep_s * (20 if torch.is_autocast_enabled("cpu") else 1))
        return x + torch.nn.functional.gelu(self.linear(x))


class TinyLM(nn.Module):
    """Embedding, a stack of same-class blocks, a head: enough structure for every knob."""

    instances = 0
    """Built in this process so far (behaviour ``alone`` fails once there are two: a model holding a
    process-wide resource, which cannot be timed side by side with another)."""

    def __init__(self, vocab_size: int = 64, width: int = 32, layers: int = 2, behaviour: str = "ok",
                 block_sleep_s: float = 0.0, activation_budget: int = 0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(Block(width, block_sleep_s) for _ in range(layers))
        self.head = nn.Linear(width, vocab_size)
        self.behaviour = behaviour
        self.calls = 0
        self.activation_budget = activation_budget
        """Bytes a forward may save for backward (0: no limit); past it the forward raises torch.OutOfMemoryError,
        as a GPU too small for the job would: checkpointing and mixed precision save less, and fit."""
        TinyLM.instances += 0 if self.head.weight.is_meta else 1  # the FLOP count builds one on the meta device

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.activation_budget and torch.is_grad_enabled() and not ids.is_meta:
            saved = [0]

            def pack(t: torch.Tensor) -> torch.Tensor:
                saved[0] += t.numel() * t.element_size()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self._forward(ids)
            if saved[0] > self.activation_budget:
                raise torch.OutOfMemoryError(f"the forward saved {saved[0]} bytes for backward, over this test "
                                             f"device's {self.activation_budget}")
            return out
        return self._forward(ids)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.behaviour == "nan_late_on_rank1":
            self.calls += 1
        if self.behaviour == "graph_break":
            torch._dynamo.graph_break()
        elif self.behaviour == "hang":
            time.sleep(3600)
        elif self.behaviour == "raise":
            raise ValueError("boom from the test model")
        elif self.behaviour == "alone" and TinyLM.instances > 1:
            raise RuntimeError("this model holds a process-wide resource: one instance per process")
        elif self.behaviour == "nan":
            x = x * float("nan")
        elif self.behaviour == "nan_late_on_rank1" and os.environ.get("RANK") == "1" and self.calls > 1:
            x = x * float("nan")  # from its second step, on rank 1 only: the other ranks see finite losses
        elif self.behaviour == "diverge" and os.environ.get("RANK") == "1":
            with torch.no_grad():  # a change DDP does not see: rank 1's parameters drift away
                self.head.bias.add_(1e-3)
        for block in self.blocks:
            x = block(x)
        out = self.head(x)
        if self.behaviour == "frozen_when_compiled" and torch.compiler.is_compiling():
            out = out.detach() + 0 * out  # compiled, no gradient reaches a weight: the step does not train
        return out


def tiny_lm(vocab_size: int = 64, behaviour: str = "ok", block_sleep_s: float = 0.0,
            activation_budget: int = 0) -> nn.Module:
    return TinyLM(vocab_size=vocab_size, behaviour=behaviour, block_sleep_s=block_sleep_s,
                  activation_budget=activation_budget)


def tiny_lm_with_extras(vocab_size: int = 64, **extras: object) -> nn.Module:
    """A factory that takes any further argument, as one passing a config dict on would."""
    return TinyLM(vocab_size=vocab_size)


class OneHotLM(nn.Module):
    """Token ids to logits without an ``nn.Embedding``: nothing says its vocabulary size."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.proj = nn.Linear(vocab_size, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.nn.functional.one_hot(ids, self.vocab_size).float())


def onehot_lm(vocab_size: int = 64) -> nn.Module:
    return OneHotLM(vocab_size)
