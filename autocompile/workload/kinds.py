"""Data that follows the model: encoder-decoder batches, and the data part ``+model=custom`` uses, which
picks token ids, masked token ids, encoder-decoder batches, images (by keyword or positionally, as the
forward takes them), audio, image-text pairs or images in a text by what the model takes
(``infer.data_kind``), or says in one line which data parts exist when that cannot be read, and which
inputs the model wants when its data cannot be made: a model never trains on a subset of its inputs.

Torch only: the worker runs this.
"""

from __future__ import annotations

from typing import Any

import torch

from autocompile.workload.data import SyntheticImages, SyntheticMaskedTokens, SyntheticTokens
from autocompile.workload.infer import DATA_KINDS, KIND_INPUTS
from autocompile.workload.multimodal import SyntheticAudio, SyntheticImageText, SyntheticSpeech, SyntheticVisionLanguage
from autocompile.workload.parts import DataFacts, PartError

DATA = "autocompile.workload.data"
MULTIMODAL = "autocompile.workload.multimodal"
DATA_PARTS = {
    "tokens": f"{DATA}.SyntheticTokens",
    "masked_tokens": f"{DATA}.SyntheticMaskedTokens",
    "seq2seq": f"{__name__}.SyntheticSeq2Seq",
    "images": f"{DATA}.SyntheticImages",
    "speech_seq2seq": f"{MULTIMODAL}.SyntheticSpeech",
    "audio": f"{MULTIMODAL}.SyntheticAudio",
    "image_text": f"{MULTIMODAL}.SyntheticImageText",
    "vision_language": f"{MULTIMODAL}.SyntheticVisionLanguage",
}
"""The shipped data part for each kind, by the dotted path ``workload.data._target_`` takes."""


class SyntheticSeq2Seq(SyntheticTokens):
    """Encoder-decoder data (T5, BART): ``({"input_ids", "attention_mask", "decoder_input_ids"}, labels)``.

    The targets (``target_len`` tokens, the source length by default) copy the start of the source, so
    the decoder learns through its cross-attention and the loss falls within a short burst; the
    decoder reads them shifted right behind ``decoder_start_token_id`` (T5's is 0), as a Hugging Face
    model shifts ``labels`` itself. ``labels_in_inputs`` also passes them as ``labels`` for a model
    that computes its own loss (``workload.loss`` = ``losses.model_loss``). Throughput counts source
    tokens (``input_ids``), as for every token model.
    """

    def __init__(self, vocab_size: int, batch_size: int, seq_len: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu", target_len: int | None = None, decoder_start_token_id: int = 0,
                 labels_in_inputs: bool = False) -> None:
        super().__init__(vocab_size, batch_size, seq_len, seed, rank, device)
        if target_len is not None and target_len < 1:
            raise PartError(f"workload.data.target_len={target_len} must be at least 1 (or null: the source length)")
        self.target_len = target_len
        self.decoder_start_token_id = decoder_start_token_id
        self.labels_in_inputs = labels_in_inputs

    def batch(self, step: int) -> tuple[Any, torch.Tensor]:
        source = self.ids(step)
        length = self.target_len or source.shape[1]
        labels = source.repeat(1, -(-length // source.shape[1]))[:, :length]
        start = torch.full_like(labels[:, :1], self.decoder_start_token_id)
        inputs = {"input_ids": source, "attention_mask": torch.ones_like(source),
                  "decoder_input_ids": torch.cat([start, labels[:, :-1]], dim=1)}
        if self.labels_in_inputs:
            inputs["labels"] = labels
        return ({k: v.to(self.device, non_blocking=True) for k, v in inputs.items()},
                labels.to(self.device, non_blocking=True))

    __call__ = batch


class SyntheticForModel:
    """The data ``+model=custom`` starts with: the shipped data part for the model's kind (``data_kind``,
    read from the model: ``DATA_PARTS``), built with the facts the model gives (``vocab_size``, image
    size, channels, classes). A model with no readable kind takes token ids when ``model.vocab_size``
    is set; otherwise the study stops before any trial with one line naming the data parts to pick
    from. Labels go into the inputs too when the model's forward requires them (``labels_required``)
    or ``labels_in_inputs`` says so (a loss the model computes: ``losses.model_loss``), under the name the
    forward gives them (``labels_name``: ``targets`` for minGPT/nanoGPT's ``forward(idx, targets)``)."""

    def __init__(self, batch_size: int, seq_len: list[int], seed: int, rank: int = 0,
                 device: str | torch.device = "cpu", data_kind: str | None = None, vocab_size: int | None = None,
                 image_size: int = 224, num_channels: int = 3, num_labels: int = 1000,
                 decoder_start_token_id: int = 0, target_len: int | None = None, labels_required: bool = False,
                 labels_in_inputs: bool = False, labels_name: str = "labels", model_inputs: tuple[str, ...] = (),
                 first_input: str = "", image_input: str = "pixel_values", num_mel_bins: int = 0,
                 feature_frames: int = 0, conv_kernel: tuple[int, ...] = (), conv_stride: tuple[int, ...] = (),
                 audio_targets: str = "classes", max_text_len: int | None = None, image_token_id: int = 0,
                 image_tokens: int = 0) -> None:
        facts: DataFacts = {"model_inputs": model_inputs, "first_input": first_input, "image_input": image_input}
        if data_kind is not None:  # None is what an absent fact reads as
            facts["data_kind"] = data_kind
        if vocab_size is not None:
            facts["vocab_size"] = vocab_size
        problem = self.check_facts(facts)
        if problem:
            raise PartError(problem)
        kind = data_kind or "tokens"
        self.kind = kind
        self.labels_in_inputs = labels_in_inputs or labels_required
        self.labels_name = labels_name
        common = {"batch_size": batch_size, "seed": seed, "rank": rank, "device": device}
        text = {"vocab_size": vocab_size, "seq_len": seq_len, "max_text_len": max_text_len}
        images = {"image_size": image_size, "num_channels": num_channels}
        if kind == "images":
            # pixel_values= for a forward that names it, else positionally (torchvision's and timm's forward(x))
            self.part: Any = SyntheticImages(**images, num_labels=num_labels, **common,
                                             input_name=image_input)
        elif kind in ("speech_seq2seq", "speech"):
            self.part = SyntheticSpeech(num_mel_bins, feature_frames, decoder=kind == "speech_seq2seq",
                                        decoder_start_token_id=decoder_start_token_id, num_labels=num_labels,
                                        labels_in_inputs=self.labels_in_inputs,
                                        **{**text, "vocab_size": vocab_size or 2}, **common)
            self.labels_in_inputs = False  # already there
        elif kind == "audio":
            self.part = SyntheticAudio(conv_kernel, conv_stride, seq_len=seq_len, audio_targets=audio_targets,
                                       vocab_size=vocab_size,
                                       num_labels=num_labels, **common)
        elif kind == "image_text":
            self.part = SyntheticImageText(**text, **images, **common)  # type: ignore[arg-type]
        elif kind == "vision_language":
            self.part = SyntheticVisionLanguage(image_token_id=image_token_id, image_tokens=image_tokens,
                                                **text, **images, **common)  # type: ignore[arg-type]
        elif kind == "seq2seq":
            self.part = SyntheticSeq2Seq(vocab_size, seq_len=seq_len, target_len=target_len,  # type: ignore[arg-type]
                                         decoder_start_token_id=decoder_start_token_id,
                                         labels_in_inputs=self.labels_in_inputs, **common)
            self.labels_in_inputs = False  # already there
        else:
            token_part = SyntheticMaskedTokens if kind == "masked_tokens" else SyntheticTokens
            self.part = token_part(vocab_size, seq_len=seq_len, **common)  # type: ignore[arg-type]

    @staticmethod
    def check_facts(facts: DataFacts, target: str = f"{__name__}.SyntheticForModel") -> str | None:
        """The one-line problem with what the model says, or None: the kind unknown, or token ids
        without a vocabulary size (``parts.data_problem`` asks before any trial)."""
        kind, vocab = facts.get("data_kind"), facts.get("vocab_size")
        if kind is not None and kind not in DATA_KINDS:
            return f"workload.data {target}: data_kind={kind!r} is none of {', '.join(DATA_KINDS)}"
        missing = missing_inputs(facts)
        if missing:
            return missing
        if kind is None and not vocab:
            parts = ", ".join(f"{path} ({name})" for name, path in DATA_PARTS.items())
            return (f"workload.data {target} needs vocab_size and the model has no input embedding to read it from: "
                    "set model.vocab_size=N for token ids; the kind of data it takes cannot be read either (no "
                    "convolution, input_ids, pixel_values or decoder_input_ids argument), so for other data set "
                    f"workload.data._target_=PART, one of {parts} or your own (step -> (inputs, targets))")
        if kind in ("tokens", "masked_tokens", "seq2seq", "image_text", "vision_language", "speech_seq2seq") \
                and not vocab:
            return (f"workload.data {target} needs vocab_size for the model's {kind} and the model has no input "
                    "embedding to read it from: set model.vocab_size=N")
        return None

    def batch(self, step: int) -> tuple[Any, Any]:
        inputs, targets = self.part(step)
        if not self.labels_in_inputs:
            return inputs, targets
        targets = targets.contiguous()  # a shifted view of one buffer; a model's own loss may .view() it (nanoGPT)
        if isinstance(inputs, dict):
            return {**inputs, self.labels_name: targets}, targets
        return (*(inputs if isinstance(inputs, (tuple, list)) else (inputs,)), targets), targets

    __call__ = batch


UNET = ("sample", "timestep")


def missing_inputs(facts: DataFacts, target: str = f"{__name__}.SyntheticForModel") -> str | None:
    """One line when the data the facts lead to would leave out an input the model's forward takes
    (``model_inputs``), or None: the inputs it wants, the ones the synthetic data can give, and how to give a
    data part that makes them all. A tensor alone goes to the forward's first argument, so that one counts
    as given (the images of a ``forward(x)``)."""
    wanted = tuple(facts.get("model_inputs") or ())
    kind = facts.get("data_kind") or ("tokens" if facts.get("vocab_size") else None)
    given = set(KIND_INPUTS.get(kind, ()) if kind else ())
    if kind in ("tokens", "images") and not (kind == "images" and facts.get("image_input")):
        given.add(str(facts.get("first_input", "")))  # a tensor alone: the forward's first argument
    missing = [name for name in wanted if name not in given]
    if not missing or (kind is None and not set(wanted) & {*UNET, "input_features", "input_values", "pixel_values"}):
        return None  # nothing left out; or nothing to go on at all, which check_facts says its own way
    made = ", ".join(name for name in wanted if name in given)
    if set(UNET) <= set(wanted):
        what = "autocompile makes no data for a diffusion UNet (diffusers' models are not read here)"
    elif kind:
        what = f"autocompile's synthetic {kind} data would give {made or 'none of them'}"
    else:
        what = "autocompile cannot tell how to make them from the model"
    keys = ", ".join(f"{name!r}: ..." for name in wanted)
    return (f"workload.data {target}: the model's forward takes {', '.join(wanted)}; {what}, and a model never "
            f"trains on a subset of its inputs: give a data part that makes all of them, "
            f"workload.data._target_=pkg.module.Part returning ({{{keys}}}, targets) for a step index "
            "(docs/own-job.md, 'How each part is called')")
