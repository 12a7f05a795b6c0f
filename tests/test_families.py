"""Every shipped model family: its tiny variant trains under compile, its blocks are found, its FLOPs counted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import ConfigError
from autocompile.study.records.record import Measurement
from autocompile.trial.program.flops import flops_per_item
from autocompile.trial.program.graphs import verify
from autocompile.workload import units
from autocompile.workload.data import rate_label
from autocompile.workload.models import build, flops_per_token
from tests.conftest import assert_ok, run_trials
from tests.jobs import FAST_MEASURE, Compose, falls, run_job

# The repeated blocks regional compile and per-block checkpointing act on, by path.
BLOCKS = {
    "gpt2-tiny": ["transformer.h.0", "transformer.h.1"],
    "llama-tiny": ["model.layers.0", "model.layers.1"],
    "bert-tiny": ["bert.encoder.layer.0", "bert.encoder.layer.1"],
    "vit-tiny": ["vit.layers.0", "vit.layers.1"],  # transformers 5: ViTModel.layers
}
FAMILIES = sorted([*BLOCKS, "t5-tiny", "mixtral-tiny", "resnet-tiny"])
"""Every shipped family's tiny variant (the last three run in every scope in tests/test_scopes.py)."""
IMAGES = ("vit", "resnet")
SMALL = ("workload.batch_size=2", "workload.seq_len=[16]", "workload.optimizer.lr=0.01", *FAST_MEASURE)


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_family_trains_under_regional_compile_with_its_blocks_found(family: str, settings_for: Compose) -> None:
    settings = settings_for(f"+model={family}", *SMALL)
    model = build(settings.model.target, settings.model.kwargs)
    assert [name for name, _ in units.blocks(model)] == BLOCKS[family]
    step, model, losses = run_job(settings, {"compile.scope": "regional", "compile.backend": "aot_eager"}, steps=8)
    assert [c for c in step.compiled if c in BLOCKS[family]] == BLOCKS[family]
    assert verify(step, model, "regional")["coverage"] == 1.0  # blocks and the rest, every weight in a graph
    assert falls(losses), losses


@pytest.mark.integration
def test_every_family_runs_a_trial_ok_with_its_flops_counted(tmp_path: Path, settings_for: Compose) -> None:
    families = FAMILIES
    specs = []
    for family in families:
        settings = settings_for(f"+model={family}", *SMALL, "workload.batch_size=4", "workload.seq_len=[32]",
                                "measure.windows=3")
        config = TrialConfig.from_flat({"compile.scope": "module", "compile.backend": "aot_eager"}, settings.env)
        specs.append(settings.trial_spec(config))
    for family, result in zip(families, run_trials(tmp_path, specs), strict=True):
        assert_ok(result)
        assert falls(result["losses"]), (family, result["losses"])
        # Mixtral routes tokens by their values: FlopCounterMode on fake tensors cannot follow it (6N estimate).
        assert result["flops_source"] == ("6N estimate" if family.startswith("mixtral") else "counted"), family
        assert result["flops_per_token"] > 0, family
        assert result["recompiles_timed"] == 0
        # Images are counted per sample, token ids per token; tables say which.
        assert result["throughput_unit"] == ("samples" if family.startswith(IMAGES) else "tokens"), family
        # Kept on the trial for the tables.
        assert rate_label(Measurement.from_dict(result)) == f"{result['throughput_unit']}/s"


def test_flops_of_linear_layers_are_exactly_what_forward_and_backward_multiply() -> None:
    width, batch = 16, 4
    inputs = torch.randn(batch, width)
    counted = flops_per_item(lambda: nn.Sequential(nn.Linear(width, width), nn.Linear(width, width)),
                             lambda out, t: out.sum(), [(inputs, None)], batch, torch.device("cpu"))
    # Per weight and sample: forward 2, weight gradient 2, input gradient 2 except for the first
    # layer (its input needs none); biases add no multiplications.
    assert counted == (4 + 6) * width * width


def test_counted_flops_of_gpt2_agree_with_the_6n_formula(settings_for: Compose) -> None:
    from autocompile.workload.data import SyntheticTokens
    from autocompile.workload.losses import cross_entropy

    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu")
    model = build(settings.model.target, settings.model.kwargs)
    data = SyntheticTokens(512, 2, [128], seed=0)
    counted = flops_per_item(lambda: build(settings.model.target, settings.model.kwargs), cross_entropy, [data(0)],
                             2 * 128, torch.device("cpu"))
    # The formula is PaLM's estimate (6N + attention), the count is every matmul: within 10%.
    assert counted == pytest.approx(flops_per_token(model, 128), rel=0.1)


def test_vocab_size_is_read_from_the_input_embedding_or_asked_for_in_one_line(settings_for: Compose) -> None:
    custom = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "workload.device=cpu")
    assert custom.model.vocab_size is None  # nothing to give: the embedding says 64
    _, _, losses = run_job(custom, {"compile.scope": "none"}, steps=2)
    assert len(losses) == 2
    with pytest.raises(ConfigError, match=r"needs vocab_size and the model has no input embedding to read it from: "
                                          r"set model.vocab_size=N"):
        settings_for("+model=custom", "model._target_=tests.models.onehot_lm", "workload.device=cpu")
    given = settings_for("+model=custom", "model._target_=tests.models.onehot_lm", "model.vocab_size=32",
                         "workload.device=cpu")
    assert given.model.vocab_size == 32


def test_a_data_function_argument_nobody_gives_is_asked_for(settings_for: Compose) -> None:
    with pytest.raises(ConfigError, match=r"workload.data tests.parts.batches needs 'vocab_size'|needs vocab_size"):
        settings_for("+model=custom", "model._target_=tests.models.onehot_lm",
                     "workload.data._target_=tests.parts.batches", "workload.device=cpu")
    with pytest.raises(ConfigError, match=r"does not import .*check the dotted path"):
        settings_for("+model=gpt2-tiny", "workload.data._target_=no_such.batches", "workload.device=cpu")
