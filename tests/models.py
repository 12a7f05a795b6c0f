"""Model factories for tests, named by dotted path like any user model (``_target_``)."""

from __future__ import annotations

import os
import signal
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

    def misbehave_when_timed(self) -> None:
        """Past the warm-up of the tests' specs (2 steps), in its turn on the device: hang, raise or die."""
        self.calls += 1
        if self.calls <= 2:
            return
        if self.behaviour == "hang_when_timed":
            time.sleep(3600)
        elif self.behaviour == "raise_when_timed":
            raise ValueError("boom from the test model, in its timed part")
        elif self.behaviour == "killed_when_timed":
            os.kill(os.getpid(), signal.SIGKILL)

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
        elif self.behaviour.endswith("_when_timed") and not ids.is_meta:
            self.misbehave_when_timed()
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
        if self.behaviour == "two_lengths":  # the same blocks again at half the length, as T5's decoder runs them
            y = x[:, : x.shape[1] // 2]
            for block in self.blocks:
                y = block(y)
            x = x + y.mean(dim=1, keepdim=True)
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


class TorchEncoder(nn.Module):
    """Torch only: an embedding, ``nn.TransformerEncoder`` (its ``layers`` are the blocks) and a head."""

    def __init__(self, vocab_size: int = 64, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


def torch_encoder(vocab_size: int = 64) -> nn.Module:
    return TorchEncoder(vocab_size)


# transformers classes as a user names them under +model=custom: the class's own defaults, tiny sizes.
def hf_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(num_layers=1, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=128,
                                               dropout_rate=0.0, decoder_start_token_id=0))


def hf_resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                     layer_type="basic", num_labels=4))


def hf_qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=128))


def hf_mixtral() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                            num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                            num_experts_per_tok=2, vocab_size=128))


class Tower(nn.Module):
    """An encoder or decoder: the embedding it is given, then its own stack of blocks."""

    def __init__(self, embed: nn.Embedding, width: int, layers: int, repeated: bool) -> None:
        super().__init__()
        self.embed_tokens = embed
        block = Block(width, 0.0)
        self.blocks = nn.ModuleList([block] * layers if repeated else [Block(width, 0.0) for _ in range(layers)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for block in self.blocks:
            x = block(x)
        return x


class SharedEmbeddingLM(nn.Module):
    """T5's layout in torch alone: the model keeps ``shared`` as a handle and never calls it; each tower
    calls its ``embed_tokens``, which is ``shared`` itself (``twins=False``, transformers 4) or an embedding
    of its own tied to ``shared``'s weight (``twins=True``, transformers 5); the head is tied to it too.
    ``repeated``: one block object at every depth of a tower (weights shared across depth, as ALBERT)."""

    def __init__(self, vocab_size: int = 64, width: int = 32, twins: bool = False, repeated: bool = False) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab_size, width)

        def embedding() -> nn.Embedding:
            if not twins:
                return self.shared
            own = nn.Embedding(vocab_size, width)
            own.weight = self.shared.weight
            return own

        self.encoder = Tower(embedding(), width, 2, repeated)
        self.decoder = Tower(embedding(), width, 2, repeated)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.shared.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids) + self.decoder(ids))


def shared_embedding_lm(vocab_size: int = 64, twins: bool = False, repeated: bool = False) -> nn.Module:
    return SharedEmbeddingLM(vocab_size, twins=twins, repeated=repeated)


class LabelledLM(TinyLM):
    """A model whose forward requires the labels (it could compute its own loss from them)."""

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(ids)


class ConvNet(nn.Module):
    """Images without any Hugging Face config: the first convolution says the channels."""

    def __init__(self, channels: int = 1, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def conv_net(channels: int = 1) -> nn.Module:
    return ConvNet(channels)
