"""Synthetic data for models that take more than token ids or images: audio features with decoder ids
(Whisper), audio features with classes, raw audio (wav2vec2: CTC or classes), image-text pairs (CLIP) and
images in a text (LLaVA). Each gives every input the model trains on, with the shapes its config fixes
(``infer.input_facts``), so a short burst learns (the loss falls) as the other synthetic parts do.

Torch only: the worker runs this.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from autocompile.workload.data import IGNORE_INDEX, SyntheticTokens, _generator
from autocompile.workload.parts import PartError

log = logging.getLogger(__name__)


def _on(device: torch.device, inputs: Mapping[str, torch.Tensor | bool],
        targets: torch.Tensor) -> tuple[dict[str, torch.Tensor | bool], torch.Tensor]:
    """The forward's keyword arguments and the targets on ``device`` (a flag such as ``return_loss`` as it is)."""
    moved = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return moved, targets.to(device, non_blocking=True)


def _text_len(seq_len: list[int], max_text_len: int | None, what: str) -> list[int]:
    """The sequence lengths within what the text tower or decoder has positions for: a longer one is cut to
    that, and the log says so (CLIP's text tower has 77 positions, Whisper's decoder 448)."""
    if max_text_len is None or max(seq_len) <= max_text_len:
        return list(seq_len)
    log.warning("workload.seq_len=%s is over the %s's %d positions: its text is %d tokens long "
                "(set workload.seq_len to choose)", list(seq_len), what, max_text_len, max_text_len)
    return [min(n, max_text_len) for n in seq_len]


class SyntheticSpeech(SyntheticTokens):
    """Audio features (``input_features``: batch x ``num_mel_bins`` x ``feature_frames``, as Whisper's encoder
    requires) with decoder ids and token targets for a speech-to-text model (``decoder=True``: the targets
    shifted right behind ``decoder_start_token_id``, ``seq_len`` long), or class labels (``decoder=False``,
    ``WhisperForAudioClassification``). The features carry the targets (a per-class or per-token offset), so
    the loss falls. Throughput counts examples (the first input is the features)."""

    def __init__(self, num_mel_bins: int, feature_frames: int, batch_size: int, seq_len: list[int], seed: int,
                 rank: int = 0, device: str | torch.device = "cpu", vocab_size: int = 2, decoder: bool = True,
                 decoder_start_token_id: int = 0, num_labels: int = 2, max_text_len: int | None = None,
                 labels_in_inputs: bool = False) -> None:
        super().__init__(vocab_size, batch_size, _text_len(seq_len, max_text_len, "decoder"), seed, rank, device)
        self.num_mel_bins, self.feature_frames = num_mel_bins, feature_frames
        self.decoder, self.decoder_start_token_id = decoder, decoder_start_token_id
        self.active_labels = max(1, min(num_labels, 4))
        self.labels_in_inputs = labels_in_inputs

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        gen = _generator(self.seed + 2, self.rank, step)
        shape = (self.batch_size, self.num_mel_bins, self.feature_frames)
        if self.decoder:
            labels = self.ids(step)
            offset = labels[:, :1].float().view(-1, 1, 1) / self.active_vocab
        else:
            labels = torch.randint(0, self.active_labels, (self.batch_size,), generator=gen)
            offset = labels.float().view(-1, 1, 1)
        inputs: dict[str, torch.Tensor] = {"input_features": torch.randn(shape, generator=gen) + offset}
        if self.decoder:
            start = torch.full_like(labels[:, :1], self.decoder_start_token_id)
            inputs["decoder_input_ids"] = torch.cat([start, labels[:, :-1]], dim=1)
        if self.labels_in_inputs:
            inputs["labels"] = labels
        return _on(self.device, inputs, labels)

    __call__ = batch

    def tokens(self, step: int) -> int:
        return self.batch_size


class SyntheticAudio:
    """Raw audio (``input_values``: batch x samples) for a wav2vec2-style model: ``seq_len`` frames of its
    feature encoder (``conv_kernel``, ``conv_stride``), with CTC labels (``audio_targets="ctc"``: a quarter as
    many token ids as frames, never the blank 0, in the inputs so the model computes its CTC loss) or class
    labels (``"classes"``, cross-entropy on its logits). Throughput counts examples."""

    def __init__(self, conv_kernel: tuple[int, ...], conv_stride: tuple[int, ...], batch_size: int,
                 seq_len: list[int], seed: int, rank: int = 0, device: str | torch.device = "cpu",
                 audio_targets: str = "classes", vocab_size: int | None = None, num_labels: int = 2) -> None:
        if audio_targets not in ("ctc", "classes"):
            raise PartError(f"workload.data.audio_targets={audio_targets!r} is neither 'ctc' nor 'classes'")
        if audio_targets == "ctc" and not vocab_size:
            raise PartError("workload.data SyntheticAudio needs vocab_size for CTC labels: set model.vocab_size=N")
        self.layers = list(zip(conv_kernel, conv_stride, strict=True))
        self.batch_size, self.seq_lens, self.seed, self.rank = batch_size, list(seq_len), seed, rank
        self.device = torch.device(device)
        self.audio_targets, self.vocab_size = audio_targets, vocab_size or 2
        self.active_labels = max(1, min(num_labels, 4))

    def samples(self, frames: int) -> int:
        """The fewest samples the feature encoder turns into ``frames`` frames."""
        for kernel, stride in reversed(self.layers):
            frames = (frames - 1) * stride + kernel
        return frames

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        gen = _generator(self.seed, self.rank, step)
        frames = self.seq_lens[step % len(self.seq_lens)]
        if self.audio_targets == "ctc":
            active = min(self.vocab_size - 1, 16)
            labels = 1 + torch.randint(0, max(1, active), (self.batch_size, max(1, frames // 4)), generator=gen)
            offset = labels[:, :1].float() / active
        else:
            labels = torch.randint(0, self.active_labels, (self.batch_size,), generator=gen)
            offset = labels.float().view(-1, 1)
        inputs: dict[str, torch.Tensor] = {"input_values": torch.randn((self.batch_size, self.samples(frames)),
                                                                       generator=gen) + offset}
        if self.audio_targets == "ctc":
            inputs["labels"] = labels
        return _on(self.device, inputs, labels)

    __call__ = batch

    def tokens(self, step: int) -> int:
        return self.batch_size


class SyntheticImageText(SyntheticTokens):
    """Image-text pairs for a contrastive model (CLIP, SigLIP): ``input_ids``, ``attention_mask``,
    ``pixel_values`` and ``return_loss=True``, so the model computes its own contrastive loss (the targets
    are each pair's index, for a loss of your own). Each pair shares a class that both its text (first token)
    and its image (a pixel offset) show, so the towers can learn to match them."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu", image_size: int = 224, num_channels: int = 3,
                 max_text_len: int | None = None) -> None:
        super().__init__(vocab_size, batch_size, _text_len(seq_len, max_text_len, "text tower"), seed, rank, device)
        self.image_size, self.num_channels = image_size, num_channels

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        ids = self.ids(step)
        gen = _generator(self.seed + 3, self.rank, step)
        shape = (self.batch_size, self.num_channels, self.image_size, self.image_size)
        pixels = torch.randn(shape, generator=gen) + ids[:, :1].float().view(-1, 1, 1, 1) / self.active_vocab
        inputs: dict[str, torch.Tensor | bool] = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                  "pixel_values": pixels, "return_loss": True}
        return _on(self.device, inputs, torch.arange(self.batch_size))

    __call__ = batch


class SyntheticVisionLanguage(SyntheticTokens):
    """Images in a text for a LLaVA-style model: ``input_ids`` that start with ``image_tokens`` image tokens
    (``image_token_id``, where the model puts one image's features) followed by ``seq_len`` text tokens,
    ``pixel_values`` of that image, and next-token targets for the text (-100 where the next token is an image
    token: nothing to predict there). The text begins with a token the image shows (a pixel offset), so the
    loss falls through the image too. Throughput counts all tokens, image ones included."""

    def __init__(self, vocab_size: int, image_token_id: int, image_tokens: int, batch_size: int, seq_len: list[int],
                 seed: int, rank: int = 0, device: str | torch.device = "cpu", image_size: int = 224,
                 num_channels: int = 3, max_text_len: int | None = None) -> None:
        super().__init__(vocab_size, batch_size, seq_len, seed, rank, device)
        longest = image_tokens + max(self.seq_lens)
        if max_text_len is not None and longest > max_text_len:
            raise PartError(f"workload.seq_len={self.seq_lens}: {image_tokens} image tokens and the text make "
                            f"{longest} positions, over the language model's {max_text_len}: lower workload.seq_len")
        self.image_token_id, self.image_tokens = image_token_id, image_tokens
        self.image_size, self.num_channels = image_size, num_channels

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        text = self.ids(step, extra=1)
        text = text + (text >= self.image_token_id).long()  # never the image token itself
        gen = _generator(self.seed + 4, self.rank, step)
        image = torch.full((self.batch_size, self.image_tokens), self.image_token_id)
        ids = torch.cat([image, text], dim=1)
        targets = ids[:, 1:].masked_fill(ids[:, 1:] == self.image_token_id, IGNORE_INDEX)
        shape = (self.batch_size, self.num_channels, self.image_size, self.image_size)
        pixels = torch.randn(shape, generator=gen) + text[:, :1].float().view(-1, 1, 1, 1) / self.active_vocab
        inputs: dict[str, torch.Tensor] = {"input_ids": ids[:, :-1], "attention_mask": torch.ones_like(ids[:, :-1]),
                                           "pixel_values": pixels}
        return _on(self.device, inputs, targets)

    __call__ = batch

    def tokens(self, step: int) -> int:
        return self.batch_size * (self.image_tokens + self.seq_len(step))
