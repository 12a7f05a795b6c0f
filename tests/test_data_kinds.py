"""The data follows the model under ``+model=custom``: images for an image model, source and decoder ids for
an encoder-decoder, token ids for a language model, and one line naming the data parts where nothing says."""

from __future__ import annotations

import pytest
import torch

from autocompile.config.settings import ConfigError
from autocompile.workload import families, models
from autocompile.workload.infer import model_facts
from autocompile.workload.kinds import DATA_PARTS, SyntheticForModel, SyntheticSeq2Seq
from autocompile.workload.parts import PartError, build_data, import_target
from tests import models as test_models
from tests.jobs import FAST_MEASURE, Compose, run_job

CUSTOM = ("+model=custom", "workload.batch_size=2", "workload.seq_len=[16]", *FAST_MEASURE)


def facts_on_meta(factory: object, **kwargs: object) -> dict[str, object]:
    with torch.device("meta"):
        return model_facts(factory(**kwargs))  # type: ignore[operator]


def test_the_kind_of_data_is_read_from_the_model() -> None:
    tiny = {"num_layers": 1, "d_model": 16, "d_ff": 16, "num_heads": 2, "d_kv": 8, "vocab_size": 64}
    assert facts_on_meta(families.t5, **tiny)["data_kind"] == "seq2seq"
    assert facts_on_meta(families.t5, **tiny)["decoder_start_token_id"] == 0
    resnet = facts_on_meta(families.resnet, image_size=32, num_labels=10)
    assert (resnet["data_kind"], resnet["image_size"], resnet["num_channels"], resnet["num_labels"]) == (
        "images", 32, 3, 10)
    assert facts_on_meta(models.gpt2, n_layer=1, n_embd=16, n_head=2, vocab_size=64)["data_kind"] == "tokens"
    assert facts_on_meta(models.bert, num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                         intermediate_size=16, vocab_size=64)["data_kind"] == "masked_tokens"
    assert facts_on_meta(test_models.torch_encoder)["data_kind"] == "tokens"
    conv = facts_on_meta(test_models.conv_net, channels=1)
    assert (conv["data_kind"], conv["num_channels"]) == ("images", 1)
    assert "data_kind" not in facts_on_meta(test_models.onehot_lm)  # nothing says: the user is asked
    assert facts_on_meta(test_models.LabelledLM)["labels_required"] is True
    assert "labels_required" not in facts_on_meta(test_models.tiny_lm)


def test_a_custom_resnet_trains_on_images(settings_for: Compose) -> None:
    # Before: "SyntheticTokens needs vocab_size ... set model.vocab_size": token advice for an image model.
    settings = settings_for(*CUSTOM, "model._target_=tests.models.hf_resnet", "+workload.data.image_size=32")
    with torch.device("meta"):
        facts = model_facts(test_models.hf_resnet())
    inputs, labels = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [16], "seed": 0})(0)
    assert inputs["pixel_values"].shape == (2, 3, 32, 32) and labels.shape == (2,)
    assert int(labels.max()) < 4  # the model's own classes
    _, _, losses = run_job(settings, {"compile.scope": "regional", "compile.backend": "aot_eager"}, steps=3)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_a_custom_t5_gets_decoder_input_ids_and_its_targets(settings_for: Compose) -> None:
    settings = settings_for(*CUSTOM, "model._target_=tests.models.hf_t5")
    with torch.device("meta"):
        facts = model_facts(test_models.hf_t5())
    inputs, labels = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [16], "seed": 0})(0)
    assert set(inputs) == {"input_ids", "attention_mask", "decoder_input_ids"}
    # The decoder reads the targets shifted right behind its start token, as T5 shifts labels itself.
    assert torch.equal(inputs["decoder_input_ids"][:, 1:], labels[:, :-1])
    assert (inputs["decoder_input_ids"][:, 0] == 0).all()
    eager = run_job(settings, {"compile.scope": "none"}, steps=3)[2]
    # The model's own loss from labels in its inputs is the same cross-entropy.
    own = settings_for(*CUSTOM, "model._target_=tests.models.hf_t5", "+workload.data.labels_in_inputs=true",
                       "workload.loss._target_=autocompile.workload.losses.model_loss")
    assert run_job(own, {"compile.scope": "none"}, steps=3)[2] == pytest.approx(eager, rel=1e-5)


def test_where_the_kind_cannot_be_read_the_line_names_the_data_parts(settings_for: Compose) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_for(*CUSTOM, "model._target_=tests.models.onehot_lm")
    line = str(raised.value)
    assert "\n" not in line and "set model.vocab_size=N" in line and "workload.data._target_=" in line
    for path in DATA_PARTS.values():
        assert path in line
        import_target(path, "workload.data")  # every part it names exists
    # Each way out it names works.
    assert settings_for(*CUSTOM, "model._target_=tests.models.onehot_lm", "model.vocab_size=32").model.vocab_size == 32
    settings_for(*CUSTOM, "model._target_=tests.models.onehot_lm", "model.vocab_size=32",
                 f"workload.data._target_={DATA_PARTS['tokens']}")


def test_labels_go_into_the_inputs_of_a_forward_that_requires_them() -> None:
    data = SyntheticForModel(batch_size=2, seq_len=[8], seed=0, data_kind="tokens", vocab_size=16, labels_required=True)
    (ids, labels), targets = data(0)
    assert torch.equal(labels, targets) and ids.shape == targets.shape == (2, 8)
    model = test_models.LabelledLM(vocab_size=16)
    assert model(ids, labels).shape == (2, 8, 16)


def test_seq2seq_targets_of_their_own_length() -> None:
    data = SyntheticSeq2Seq(vocab_size=32, batch_size=2, seq_len=[4], seed=0, target_len=6, labels_in_inputs=True)
    inputs, labels = data(0)
    assert inputs["input_ids"].shape == (2, 4) and labels.shape == inputs["decoder_input_ids"].shape == (2, 6)
    assert torch.equal(inputs["labels"], labels)
    with pytest.raises(PartError, match="target_len=0 must be at least 1"):
        SyntheticSeq2Seq(vocab_size=32, batch_size=2, seq_len=[4], seed=0, target_len=0)


def test_nanogpts_own_gpt_trains_on_its_targets_and_its_own_loss(settings_for: Compose) -> None:
    """karpathy/nanoGPT's ``forward(idx, targets=None)`` returns ``(logits, loss)`` given targets and only the
    last position's logits without: the data hands it the targets and the loss is the one it computed."""
    from autocompile.workload.losses import cross_entropy, logits_of
    from examples.models import nanogpt

    with torch.device("meta"):
        facts = model_facts(nanogpt.tiny(n_layer=1, n_embd=16, block_size=16))
    assert (facts["data_kind"], facts["vocab_size"], facts["labels_required"], facts["labels_name"]) == (
        "tokens", 65, True, "targets")
    settings = settings_for(*CUSTOM, "model._target_=examples.models.nanogpt.tiny", "+model.n_layer=1",
                            "+model.n_embd=16", "+model.block_size=16")
    (ids, targets_in), targets = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [16],
                                                                      "seed": 0})(0)
    assert targets_in.is_contiguous() and torch.equal(targets_in, targets)
    torch.manual_seed(0)
    model = nanogpt.tiny(n_layer=1, n_embd=16, block_size=16)
    output = model(ids, targets_in)
    assert cross_entropy(output, targets) is output[1]  # not charged a second loss
    assert logits_of(output).shape == (2, 16, 65)
    assert output[1].item() == pytest.approx(torch.nn.functional.cross_entropy(
        logits_of(output).reshape(-1, 65), targets.reshape(-1)).item(), rel=1e-6)
    _, _, losses = run_job(settings, {"compile.scope": "regional", "compile.backend": "aot_eager"}, steps=3)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
