"""A trial runs the program its configuration names: every unit compiled (or a failure naming it),
every repeated stack found, and one fingerprint for configurations that are the same program."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from autocompile.config.knobs import Env, TrialConfig
from autocompile.trial.program.graphs import NothingCompiled, PartiallyCompiled, verify
from autocompile.trial.program.step import apply, lm_loss
from autocompile.workload import units
from autocompile.workload.data import SyntheticTokens
from autocompile.workload.models import gpt2

VOCAB = 64


class EncoderLM(nn.Module):
    """Blocks whose forward is defined inside torch (nn.TransformerEncoderLayer), and a ModuleList of
    output heads: ``module.compile()`` on such a block compiles nothing."""

    def __init__(self, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True) for _ in range(layers))
        self.heads = nn.ModuleList(nn.Linear(16, VOCAB) for _ in range(heads))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return sum(head(x) for head in self.heads)


class SequentialMlpBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))  # forward defined in torch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class LeafBlock(nn.Module):
    """Only leaf layers: "children that have children" finds no sublayer at all."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.proj(self.norm(x)))


class StackLM(nn.Module):
    def __init__(self, block: type[nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.blocks = nn.ModuleList(block() for _ in range(2))
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tiny_gpt2() -> nn.Module:
    return gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64)


def build(factory: Any, knobs: dict[str, Any], steps: int = 2) -> tuple[Any, nn.Module, list[float]]:
    torch._dynamo.reset()
    env = Env.detect("cpu", 1, False)
    config = TrialConfig.from_flat({"compile.backend": "aot_eager", **knobs}, env, strict=False)
    torch.manual_seed(0)
    model = factory()
    step = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss, config)
    data = SyntheticTokens(VOCAB, 2, [8], seed=0)
    return step, model, [float(step(*data.batch(i))) for i in range(steps)]


def checked(factory: Any, knobs: dict[str, Any]) -> dict[str, Any]:
    step, model, _ = build(factory, knobs)
    return verify(step, model, knobs.get("compile.scope", "module"))


# The compiled optimizer over it is integration (5-6 s; default run: a compiled optimizer's graph verified in a real
# trial, tests/test_parts.py::test_user_data_loss_optimizer_and_schedule_run_a_trial_ok).
@pytest.mark.parametrize("optimizer", [False, pytest.param(True, marks=pytest.mark.integration)])
def test_regional_on_torch_defined_blocks_compiles_every_block(optimizer: bool) -> None:
    program = checked(EncoderLM, {"compile.scope": "regional", "compile.optimizer": optimizer})
    assert program["coverage"] == 1.0


def test_sequential_mlp_under_sublayer_is_compiled() -> None:
    step, model, _ = build(lambda: StackLM(SequentialMlpBlock), {
        "compile.scope": "regional", "compile.granularity": "sublayer", "compile.rest": "eager"})
    assert "blocks.0.mlp" in step.compiled
    verify(step, model, "regional")  # raises if the Sequential's weights ran eager
    seen = set().union(*(g.param_ids for g in step.log.graphs))
    assert id(model.blocks[0].mlp[0].weight) in seen


def test_leaf_only_blocks_under_sublayer_compile_their_layers() -> None:
    step, model, _ = build(lambda: StackLM(LeafBlock), {
        "compile.scope": "regional", "compile.granularity": "sublayer", "compile.rest": "eager"})
    assert step.compiled == ["blocks.0.norm", "blocks.0.proj", "blocks.1.norm", "blocks.1.proj"]
    blocks = sum(p.numel() for p in model.blocks.parameters())
    assert verify(step, model, "regional")["coverage"] == pytest.approx(
        blocks / sum(p.numel() for p in model.parameters()))


def test_a_unit_that_runs_eager_fails_naming_it() -> None:
    step, model, _ = build(EncoderLM, {"compile.scope": "regional", "compile.rest": "eager"}, steps=0)
    del model.layers[1].__dict__["forward"]  # a wrapper that bypasses the compiled forward: layer 1 runs eager
    with pytest.raises(NothingCompiled):
        verify(step, model, "regional")  # nothing has run yet
    step(*SyntheticTokens(VOCAB, 2, [8], seed=0).batch(0))
    with pytest.raises(PartiallyCompiled, match=r"^layers\.1 handed"):
        verify(step, model, "regional")


def test_every_stack_is_found_encoder_and_decoder() -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
                      num_heads=2, decoder_start_token_id=0)
    with torch.device("meta"):
        model = T5ForConditionalGeneration(config)
    names = [name for name, _ in units.blocks(model)]
    assert names == ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"]
    rest = {name for name, _ in units.rest(model)}
    # T5's tied ``shared`` embedding is called as encoder.embed_tokens / decoder.embed_tokens: compiled there.
    assert {"encoder.embed_tokens", "decoder.embed_tokens", "lm_head"} <= rest and "shared" not in rest


def test_heads_are_a_stack_of_their_own_not_a_rival_to_the_blocks() -> None:
    model = EncoderLM()
    assert [name for name, _ in units.stacks(model)] == ["layers", "heads"]
    step, model, _ = build(EncoderLM, {"compile.scope": "regional", "ac.policy": "block"})
    assert step.compiled[:2] == ["layers.0", "layers.1"]
    assert verify(step, model, "regional")["coverage"] == 1.0


def test_structure_decides_which_values_are_offered() -> None:
    class NoBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.net(ids)

    env = Env.detect("cpu", 1, False, units.Structure.of(NoBlocks()))
    from autocompile.config.knobs import KNOBS

    assert "regional" not in KNOBS["compile.scope"][0].allowed({}, env)
    leaf_env = Env.detect("cpu", 1, False, units.Structure.of(StackLM(LeafBlock)))
    assert leaf_env.splits_blocks  # norm and proj are two parts with weights
    single = units.Structure.of(gpt2(n_layer=1, n_embd=8, n_head=2, vocab_size=VOCAB, n_positions=16))
    assert single.has_blocks and single.has_rest


# --- program identity ---

def fingerprint(knobs: dict[str, Any], factory: Any = tiny_gpt2) -> str:
    return checked(factory, knobs)["fingerprint"]


def test_placement_order_is_the_same_program() -> None:
    a = fingerprint({"compile.scope": "module", "placement.order": "to_then_compile"})
    b = fingerprint({"compile.scope": "module", "placement.order": "compile_then_to"})
    assert a == b


def test_autocast_inside_or_outside_is_the_same_program() -> None:
    base = {"compile.scope": "module", "amp.dtype": "bfloat16"}
    assert fingerprint({**base, "amp.placement": "outside"}) == fingerprint({**base, "amp.placement": "inside"})


def test_knobs_that_change_the_program_change_the_fingerprint() -> None:
    from tests.models import tiny_lm

    # The tests' tiny LM (embedding, blocks, head): five aot_eager builds of it take a sixth of GPT-2's time.
    module = fingerprint({"compile.scope": "module"}, tiny_lm)
    assert fingerprint({"compile.scope": "module", "compile.optimizer": True}, tiny_lm) != module
    assert fingerprint({"compile.scope": "module", "amp.dtype": "bfloat16"}, tiny_lm) != module
    assert fingerprint({"compile.scope": "regional"}, tiny_lm) != fingerprint({"compile.scope": "regional",
                                                                              "compile.rest": "eager"}, tiny_lm)


def test_a_compile_memory_budget_changes_what_backward_saves_not_what_it_computes() -> None:
    """Issue 37: ``ac.policy=budget_*`` sets compile's activation memory budget while its own graphs compile:
    AOTAutograd's partitioner saves less and recomputes more (other forward and backward graphs), the losses
    are the same; offered only where something compiles through AOTAutograd."""
    import functools

    from autocompile.config.knobs import KNOBS
    from tests.models import tiny_lm

    env = Env.detect("cpu", 1, False)
    assert env.memory_budget  # torch 2.11-2.15 all have torch._functorch.config.activation_memory_budget
    offered = KNOBS["ac.policy"][0].values
    assert offered({"compile.scope": "module", "compile.backend": "aot_eager"}, env)[2:] == ("budget_0.5",
                                                                                             "budget_0.25")
    assert offered({"compile.scope": "none", "compile.backend": "inductor"}, env) == ("none", "block")
    assert offered({"compile.scope": "module", "compile.backend": "eager"}, env) == ("none", "block")
    runs = {}
    for policy in ("none", "budget_0.25"):
        torch.manual_seed(0)
        torch._dynamo.reset()
        config = TrialConfig.from_flat({"compile.scope": "module", "compile.backend": "aot_eager", "ac.policy": policy},
                                       env)
        step = apply(tiny_lm(), functools.partial(torch.optim.SGD, lr=0.1), lm_loss, config)
        ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
        runs[policy] = ([float(step(ids[:, :-1], ids[:, 1:])) for _ in range(3)], list(step.log.aten))
    assert runs["budget_0.25"][0] == pytest.approx(runs["none"][0], rel=1e-6)
    assert runs["budget_0.25"][1] != runs["none"][1]  # another partition: other aten graphs, another fingerprint
    assert torch._functorch.config.activation_memory_budget == 1.0  # set only while its graphs compiled
