"""Any model in any scope: every shipped family, a transformers model named as a user would and a torch-only
model train in every ``compile.scope``, every unit handed to compile runs compiled, and shared or tied
modules are compiled where they are called."""

from __future__ import annotations

import pytest
import torch

from autocompile.config.knobs import CompileKnobs
from autocompile.trial.program.apply_parts import compile_targets
from autocompile.trial.program.graphs import verify
from autocompile.workload import units
from autocompile.workload.models import build
from tests import models as test_models
from tests.jobs import FAST_MEASURE, Compose, run_job

SMALL = ("workload.batch_size=2", "workload.seq_len=[16]", "workload.optimizer.lr=0.01", *FAST_MEASURE)
MODELS = {
    "gpt2-tiny": ("+model=gpt2-tiny",),
    "llama-tiny": ("+model=llama-tiny",),
    "bert-tiny": ("+model=bert-tiny",),
    "vit-tiny": ("+model=vit-tiny",),
    "t5-tiny": ("+model=t5-tiny",),
    "mixtral-tiny": ("+model=mixtral-tiny",),
    "resnet-tiny": ("+model=resnet-tiny",),
    "qwen2 (custom)": ("+model=custom", "model._target_=tests.models.hf_qwen2"),
    "torch encoder (custom)": ("+model=custom", "model._target_=tests.models.torch_encoder"),
}
SCOPES = ("module", "regional", "train_step")
STEPS = 3


def every_scope(settings_for: Compose, name: str, backend: str) -> None:
    """Eager, then each compiled scope: the same losses (one program, compiled), every unit entered."""
    settings = settings_for(*MODELS[name], *SMALL)
    eager = run_job(settings, {"compile.scope": "none"}, steps=STEPS)[2]
    assert all(torch.isfinite(torch.tensor(eager))), eager
    for scope in SCOPES:
        step, model, losses = run_job(settings, {"compile.scope": scope, "compile.backend": backend}, steps=STEPS)
        checked = verify(step, model, scope)  # raises when a unit handed to compile ran eager
        assert checked["coverage"] == 1.0, (name, scope)
        assert all(calls > 0 for calls in step.log.calls.values()), (name, scope, step.log.calls)
        assert losses == pytest.approx(eager, rel=2e-3, abs=1e-4), (name, scope)


# The default run: one fast representative (resnet-tiny, a family beyond the transformers, 4 short jobs); every
# other family, the user's transformers model and the torch-only one run here under integration, where each also
# runs under inductor (below). t5-tiny's tied embedding under regional stays in the default run (the next test),
# and the decoder families' regional compile in test_families.py's.
DEFAULT_RUN = ("resnet-tiny",)


@pytest.mark.parametrize("name", [n if n in DEFAULT_RUN else pytest.param(n, marks=pytest.mark.integration)
                                  for n in sorted(MODELS)])
def test_every_model_trains_in_every_scope_under_aot_eager(name: str, settings_for: Compose) -> None:
    every_scope(settings_for, name, "aot_eager")


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_trains_in_every_scope_under_inductor(name: str, settings_for: Compose) -> None:
    every_scope(settings_for, name, "inductor")


def test_t5_regional_compiles_its_tied_embedding_where_it_is_called(settings_for: Compose) -> None:
    # Before: "partially_compiled: shared handed to torch.compile but ran eager" (T5 calls it as embed_tokens).
    # Where the units are compiled is the subject, not the backend: t5-tiny's aot_eager regional run is above.
    settings = settings_for("+model=t5-tiny", *SMALL)
    step, model, losses = run_job(settings, {"compile.scope": "regional", "compile.backend": "eager"}, steps=4)
    assert verify(step, model, "regional")["coverage"] == 1.0
    assert "shared" not in step.compiled
    assert {"encoder.embed_tokens", "decoder.embed_tokens", "lm_head"} <= set(step.compiled)
    assert all(calls > 0 for calls in step.log.calls.values()), step.log.calls
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(("twins", "repeated"), [(False, False), (True, False), (False, True)])
def test_shared_and_tied_modules_are_compiled_once_where_they_are_called(
        twins: bool, repeated: bool, settings_for: Compose) -> None:
    model = test_models.shared_embedding_lm(twins=twins, repeated=repeated)
    rest = [name for name, _ in units.rest(model)]
    # Never the handle the model does not call; one object under several paths once.
    assert rest == (["encoder.embed_tokens", "decoder.embed_tokens", "head"] if twins else
                    ["encoder.embed_tokens", "head"])
    blocks = [name for name, _ in units.blocks(model)]
    assert blocks == (["encoder.blocks.0", "decoder.blocks.0"] if repeated else
                      ["encoder.blocks.0", "encoder.blocks.1", "decoder.blocks.0", "decoder.blocks.1"])
    for granularity in ("block", "sublayer"):
        targets = compile_targets(model, CompileKnobs(scope="regional", granularity=granularity))
        assert len({id(m) for _, m in targets}) == len(targets), granularity  # nothing compiled twice
    settings = settings_for("+model=custom", "model._target_=tests.models.shared_embedding_lm",
                            f"+model.twins={twins}", f"+model.repeated={repeated}", *SMALL)
    eager = run_job(settings, {"compile.scope": "none"}, steps=STEPS)[2]
    step, built, losses = run_job(settings, {"compile.scope": "regional", "compile.backend": "aot_eager"},
                                  steps=STEPS)
    assert step.compiled == blocks + rest
    assert all(calls > 0 for calls in step.log.calls.values()), step.log.calls
    assert verify(step, built, "regional")["coverage"] == 1.0
    assert losses == pytest.approx(eager, rel=1e-4)


def test_a_shipped_family_s_blocks_and_the_rest(settings_for: Compose) -> None:
    for family, blocks, rest in [
        ("t5-tiny", ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"],
         ["encoder.embed_tokens", "encoder.final_layer_norm", "decoder.embed_tokens", "decoder.final_layer_norm",
          "lm_head"]),
        ("mixtral-tiny", ["model.layers.0", "model.layers.1"], ["model.embed_tokens", "model.norm", "lm_head"]),
        ("resnet-tiny", ["resnet.encoder.stages.0", "resnet.encoder.stages.1"], ["resnet.embedder", "classifier"]),
    ]:
        settings = settings_for(f"+model={family}", "workload.device=cpu")
        with torch.device("meta"):
            model = build(settings.model.target, settings.model.kwargs)
        assert [n for n, _ in units.blocks(model)] == blocks, family
        assert [n for n, _ in units.rest(model)] == rest, family


def test_nested_regions_are_offered_only_where_every_block_has_one_structure(settings_for: Compose) -> None:
    """torch 2.13 reuses one nested region's graph across ResNet's stages of other widths (a shape error) and
    T5's blocks (the first alone holds the relative-position bias): the space leaves nested out there."""
    from autocompile.config.knob_spec import Env
    from autocompile.config.knobs import _granularities

    offered = {}
    for model in ("gpt2-tiny", "t5-tiny", "resnet-tiny"):
        settings = settings_for(f"+model={model}", "workload.device=cpu", *FAST_MEASURE)
        with torch.device("meta"):
            structure = units.Structure.of(build(settings.model.target, settings.model.kwargs))
        offered[model] = _granularities({}, Env(nested_regions=True, **{"same_blocks": structure.same_blocks}))
    assert "nested" in offered["gpt2-tiny"]
    assert "nested" not in offered["t5-tiny"] and "nested" not in offered["resnet-tiny"]
