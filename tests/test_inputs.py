"""The data follows the model's signature, not only its kind (issue 37): under ``+model=custom`` a torchvision- or
timm-style ``forward(x)`` gets its images positionally, a transformers Whisper its audio features and decoder ids,
wav2vec2 raw audio, CLIP image-text pairs and a LLaVA-style model images in its text, each training in every
compiled scope; a model whose inputs cannot be made (a diffusion UNet's) fails before any trial in one line that
names the inputs it wants and how to give a data part. A model never trains on a subset of its inputs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from autocompile.config.settings import ConfigError
from autocompile.trial.program.graphs import verify
from autocompile.workload.infer import model_facts
from autocompile.workload.parts import build_data
from tests.jobs import FAST_MEASURE, Compose, run_job
from tests.test_scopes import SCOPES

SMALL = ("+model=custom", "workload.batch_size=2", "workload.seq_len=[8]", "workload.optimizer.lr=0.01",
         *FAST_MEASURE)
HERE = "tests.test_inputs"


class TorchvisionStyleResNet(nn.Module):
    """torchvision's and timm's way: ``forward(x)``, a stem convolution, residual blocks, a head."""

    def __init__(self, width: int = 8, blocks: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layers = nn.ModuleList(BasicBlock(width) for _ in range(blocks))
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        for layer in self.layers:
            x = layer(x)
        return self.fc(x.mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn(self.conv(x)))


def torchvision_style() -> nn.Module:
    return TorchvisionStyleResNet()


def torchvision_resnet18() -> nn.Module:
    from torchvision.models import resnet18  # only where torchvision is installed

    return resnet18(num_classes=4)


def whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=64, num_mel_bins=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=8,
        max_target_positions=16, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        use_cache=False))


def wav2vec2() -> nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    return Wav2Vec2ForCTC(Wav2Vec2Config(
        vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2, ctc_loss_reduction="mean", pad_token_id=0, mask_time_prob=0.0,
        layerdrop=0.0, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))


def clip() -> nn.Module:
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(CLIPConfig(
        text_config={"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 16, "bos_token_id": 0, "eos_token_id": 2,
                     "pad_token_id": 1},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 8},
        projection_dim=8))


def llava() -> nn.Module:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=8)
    text = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, use_cache=False,
                       bos_token_id=0, eos_token_id=2, pad_token_id=1)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_id=63,
                                                      vision_feature_layer=-1))
    model.loss_type = "ForCausalLM"
    return model


class UNetLike(nn.Module):
    """A conditional diffusion UNet's forward, as diffusers' ``UNet2DConditionModel`` takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(4, 8, 3, padding=1)
        self.time = nn.Linear(1, 8)
        self.cross = nn.Linear(16, 8)
        self.conv_out = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                return_dict: bool = True) -> torch.Tensor:
        h = self.conv_in(sample) + self.time(timestep.float().view(-1, 1))[:, :, None, None]
        return self.conv_out(h + self.cross(encoder_hidden_states).mean(1)[:, :, None, None])


def unet_like() -> nn.Module:
    return UNetLike()


def facts_of(factory: object) -> dict[str, object]:
    with torch.device("meta"):
        return model_facts(factory())  # type: ignore[operator]


def trains_eager(settings_for: Compose, name: str) -> list[float]:
    """Three eager steps of the job the worker would build: finite losses (the default run)."""
    settings = settings_for(*SMALL, f"model._target_={HERE}.{name}", *EXTRA.get(name, ()))
    losses = run_job(settings, {"compile.scope": "none"}, steps=3)[2]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    return losses


EXTRA = {"torchvision_style": ("+workload.data.image_size=16",),
         "torchvision_resnet18": ("+workload.data.image_size=32",)}
MODELS = ["torchvision_style", "whisper", "wav2vec2", "clip", "llava",
          pytest.param("torchvision_resnet18", marks=pytest.mark.skipif(
              importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed"))]


@pytest.mark.integration
@pytest.mark.parametrize("name", MODELS)
def test_each_model_trains_in_every_scope_under_aot_eager(name: str, settings_for: Compose) -> None:
    """Eager, then each compiled scope (about 30-80 s a model on 2 cores): the same losses, every unit that was
    handed to compile ran compiled."""
    settings = settings_for(*SMALL, f"model._target_={HERE}.{name}", *EXTRA.get(name, ()))
    eager = run_job(settings, {"compile.scope": "none"}, steps=3)[2]
    assert all(torch.isfinite(torch.tensor(eager))), eager
    for scope in SCOPES:
        step, model, losses = run_job(settings, {"compile.scope": scope, "compile.backend": "aot_eager"}, steps=3)
        coverage = verify(step, model, scope)["coverage"]  # raises when a unit handed to compile ran eager
        # Regional compile hands over modules: a bare weight held beside submodules (CLIP's logit_scale, wav2vec2's
        # masked_spec_embed, unused without SpecAugment) is in none of them.
        bare = sum(p.numel() for m in model.modules() if next(m.children(), None) is not None
                   for p in m.parameters(recurse=False)) / sum(p.numel() for p in model.parameters())
        assert coverage == 1.0 or (scope == "regional" and coverage >= 1.0 - bare - 1e-9), (name, scope, coverage)
        assert losses == pytest.approx(eager, rel=2e-3, abs=1e-4), (name, scope)


def test_a_forward_x_model_gets_its_images_positionally(settings_for: Compose) -> None:
    # Before: every trial failed with "TypeError: forward() got an unexpected keyword argument 'pixel_values'".
    facts = facts_of(torchvision_style)
    assert (facts["data_kind"], facts["image_input"], facts["model_inputs"]) == ("images", "", ("x",))
    settings = settings_for(*SMALL, f"model._target_={HERE}.torchvision_style", "+workload.data.image_size=16")
    inputs, labels = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [8], "seed": 0})(0)
    assert isinstance(inputs, torch.Tensor) and inputs.shape == (2, 3, 16, 16) and labels.shape == (2,)
    trains_eager(settings_for, "torchvision_style")
    # A forward that names pixel_values still gets them by keyword.
    assert facts_of(lambda: __import__("tests.models", fromlist=["hf_resnet"]).hf_resnet())["image_input"] == (
        "pixel_values")


def test_a_whisper_with_no_data_given_trains_on_audio_features_and_decoder_ids(settings_for: Compose) -> None:
    # Before: "AttributeError: 'NoneType' object has no attribute 'shape'" in every trial (token ids, no features).
    facts = facts_of(whisper)
    assert facts["data_kind"] == "speech_seq2seq"
    assert facts["model_inputs"] == ("input_features", "decoder_input_ids")
    settings = settings_for(*SMALL, f"model._target_={HERE}.whisper")
    inputs, labels = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [8], "seed": 0})(0)
    # Whisper's encoder takes exactly max_source_positions x its conv strides frames of num_mel_bins features.
    assert inputs["input_features"].shape == (2, 8, 16)
    assert torch.equal(inputs["decoder_input_ids"][:, 1:], labels[:, :-1])
    assert (inputs["decoder_input_ids"][:, 0] == 1).all()  # the model's decoder_start_token_id
    trains_eager(settings_for, "whisper")


def test_a_wav2vec2_trains_on_raw_audio_with_its_ctc_loss(settings_for: Compose) -> None:
    facts = facts_of(wav2vec2)
    assert (facts["data_kind"], facts["audio_targets"], facts["vocab_size"]) == ("audio", "ctc", 16)
    settings = settings_for(*SMALL, f"model._target_={HERE}.wav2vec2")
    inputs, labels = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [8], "seed": 0})(0)
    torch.manual_seed(0)
    model = wav2vec2()
    # seq_len counts frames of the feature encoder: its samples make exactly that many.
    assert int(model._get_feat_extract_output_lengths(torch.tensor(inputs["input_values"].shape[1]))) == 8
    assert torch.equal(inputs["labels"], labels) and int(labels.min()) >= 1  # never the CTC blank
    assert torch.isfinite(model(**inputs).loss)
    trains_eager(settings_for, "wav2vec2")


def test_a_clip_trains_on_image_text_pairs(settings_for: Compose) -> None:
    # Before: the data fell back to token ids alone (the model has an input embedding): no images, no loss.
    facts = facts_of(clip)
    assert (facts["data_kind"], facts["model_inputs"]) == ("image_text", ("input_ids", "pixel_values"))
    settings = settings_for(*SMALL, f"model._target_={HERE}.clip")
    inputs, _ = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [8], "seed": 0})(0)
    assert inputs["pixel_values"].shape == (2, 3, 16, 16) and inputs["input_ids"].shape == (2, 8)
    assert inputs["return_loss"] is True  # the model's own contrastive loss
    trains_eager(settings_for, "clip")


def test_a_llava_style_model_trains_on_images_in_its_text(settings_for: Compose) -> None:
    # Before: token ids alone, trained text-only without a word.
    facts = facts_of(llava)
    assert (facts["data_kind"], facts["image_token_id"], facts["image_tokens"]) == ("vision_language", 63, 4)
    settings = settings_for(*SMALL, f"model._target_={HERE}.llava")
    inputs, targets = build_data(settings.workload.data, {**facts, "batch_size": 2, "seq_len": [8], "seed": 0})(0)
    ids = inputs["input_ids"]
    assert ids.shape == (2, 4 + 8) and (ids[:, :4] == 63).all() and not (ids[:, 4:] == 63).any()
    assert inputs["pixel_values"].shape == (2, 3, 16, 16)
    assert (targets[:, :3] == -100).all() and torch.equal(targets[:, 4:-1], ids[:, 5:])
    trains_eager(settings_for, "llava")


def test_a_model_whose_inputs_cannot_be_made_fails_before_any_trial_naming_them(settings_for: Compose) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_for(*SMALL, f"model._target_={HERE}.unet_like")
    line = str(raised.value)
    assert "\n" not in line
    assert "forward takes sample, timestep, encoder_hidden_states" in line
    assert "workload.data._target_=" in line and "docs/own-job.md" in line
