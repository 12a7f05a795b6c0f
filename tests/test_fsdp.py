"""FSDP2 (``parallel.strategy=fsdp2``): ``fully_shard`` per block and on the root, in either order with compile,
and the per-unit checks, coverage and fingerprints on sharded models.

In-process on a one-rank gloo group with ``aot_eager`` (FSDP2's hooks, DTensor parameters and unsharded
copies are all there at one rank); the two-rank trials through torchrun are integration-marked. Each
combination the knob table refuses under FSDP2 is shown failing here first.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor

from autocompile.config.knobs import (
    AmpKnobs,
    CompileKnobs,
    Env,
    FsdpKnobs,
    KnobError,
    ParallelKnobs,
    TrialConfig,
)
from autocompile.config.spec import SideBySideSpec
from autocompile.trial.program.graphs import PartiallyCompiled, coverage, listening, verify
from autocompile.trial.program.step import apply, lm_loss
from autocompile.workload.data import SyntheticTokens
from autocompile.workload.models import gpt2
from tests.conftest import QUICK_ROUNDS, TINY_GPT2, assert_ok, launched, make_spec, run_trials

TWO_RANKS = Env.detect("cpu", 2, False)
AOT = {"compile.backend": "aot_eager"}
FSDP2 = {"parallel.strategy": "fsdp2"}
BLOCKS = ["transformer.h.0", "transformer.h.1"]


@pytest.fixture(scope="module", autouse=True)
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo group: FSDP2 shards over it (DTensor parameters, hooks, unsharded copies) in-process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def run(config: TrialConfig | dict[str, Any], steps: int = 3, **kwargs: Any) -> tuple[Any, torch.nn.Module, list]:
    """``config`` (knobs over FSDP2 and aot_eager, or a TrialConfig built as is) applied to a tiny GPT-2,
    ``steps`` steps trained; the step, the model and the losses."""
    torch._dynamo.reset()
    counters.clear()
    if isinstance(config, dict):
        base = {**FSDP2, **(AOT if config.get("compile.scope", "module") != "none" else {})}
        config = TrialConfig.from_flat({**base, **config}, TWO_RANKS)
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64)
    step = apply(model, functools.partial(torch.optim.AdamW, lr=1e-3), lm_loss, config, distributed=True, **kwargs)
    data = SyntheticTokens(128, 2, [16], seed=0)
    with listening(step.log):
        losses = [float(step(*data.batch(i))) for i in range(steps * kwargs.get("grad_accum_steps", 1))]
    return step, model, losses


def test_both_orders_compile_one_program_with_every_weight_inside_and_the_hooks_outside() -> None:
    _, _, eager = run({"compile.scope": "none"})
    programs = {}
    for order in ("compile_then_shard", "shard_then_compile"):
        step, model, losses = run({"compile.scope": "regional", "fsdp.order": order})
        assert step.sharded == [*BLOCKS, "model"]
        assert all(isinstance(p, DTensor) for p in model.parameters())  # sharded between steps
        programs[order] = verify(step, model, "regional")
        assert programs[order]["coverage"] == 1.0
        assert losses == pytest.approx(eager, rel=1e-5)
        assert sum(counters["graph_break"].values()) == 0  # FSDP2's hooks run in __call__, around the compiled forward
        # The graphs hold FSDP2's unsharded copies, never the sharded parameters: without mapping them back
        # every unit would read as eager.
        assert set(coverage(step.log, list(model.parameters()), step.units).missing) == {u for u, _ in step.units}
    assert programs["compile_then_shard"] == programs["shard_then_compile"]  # one program: same graphs, same hooks
    step, model, _ = run({"compile.scope": "regional", "fsdp.reshard_after_forward": False})
    kept = verify(step, model, "regional")
    assert kept["coverage"] == 1.0 and kept["fingerprint"] != programs["compile_then_shard"]["fingerprint"]


def test_fsdp2_and_ddp_with_the_same_graphs_are_different_programs() -> None:
    step, model, _ = run({"compile.scope": "regional"})
    sharded = verify(step, model, "regional")["fingerprint"]
    step, model, _ = run({"parallel.strategy": "ddp", "compile.scope": "regional"})
    assert verify(step, model, "regional")["fingerprint"] != sharded
    assert step.sharded == [] and not any(isinstance(p, DTensor) for p in model.parameters())


def test_module_scope_breaks_at_each_blocks_hooks_so_fullgraph_is_offered_only_per_block() -> None:
    step, model, _ = run({"compile.scope": "module"})
    assert verify(step, model, "module")["coverage"] == 1.0
    breaks = counters["graph_break"]
    # At each block's FSDP2 hooks (one or two breaks a block, by torch build: 2 on 2.13.0+cpu here).
    assert sum(breaks.values()) in (len(BLOCKS), 2 * len(BLOCKS)) and all("skipped" in reason for reason in breaks)
    whole = TrialConfig(parallel=ParallelKnobs("fsdp2"), compile=CompileKnobs(backend="aot_eager", fullgraph=True))
    with pytest.raises(torch._dynamo.exc.Unsupported, match="skipped"):
        run(whole, steps=1)
    with pytest.raises(KnobError, match="always break its graph"):
        TrialConfig.from_flat({**FSDP2, "compile.fullgraph": True}, TWO_RANKS)
    with pytest.raises(KnobError, match="always break its graph"):
        TrialConfig.from_flat({**FSDP2, "compile.scope": "regional", "compile.granularity": "nested",
                               "compile.fullgraph": True}, TWO_RANKS)
    step, model, _ = run({"compile.scope": "regional", "compile.fullgraph": True})  # the hooks are outside
    assert verify(step, model, "regional")["coverage"] == 1.0


@pytest.mark.integration  # 13 s: compiled autograd compiles the backward again as FSDP2's state changes
def test_compiled_autograd_under_fsdp2_does_not_train_so_it_is_not_offered() -> None:
    config = TrialConfig(parallel=ParallelKnobs("fsdp2"),
                         compile=CompileKnobs(scope="regional", backend="aot_eager", compiled_autograd=True))
    step, model, losses = run(config, steps=2)
    _, _, trained = run({"compile.scope": "regional"}, steps=2)
    assert losses[0] == pytest.approx(trained[0]) and losses[1] != pytest.approx(trained[1])
    # FSDP2's post-backward hooks never ran: the modules kept their unsharded parameters, which the forward
    # uses and no optimizer steps (it steps the sharded ones).
    assert not any(isinstance(p, DTensor) for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    step(*SyntheticTokens(128, 2, [16], seed=0).batch(2))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(PartiallyCompiled):
        verify(step, model, "regional")
    with pytest.raises(KnobError, match="training stops after the first step"):
        TrialConfig.from_flat({**FSDP2, "compile.compiled_autograd": True}, TWO_RANKS)


def test_mixed_precision_policy_keeps_fp32_shards_and_combines_with_autocast() -> None:
    _, _, fp32 = run({"compile.scope": "regional"})
    fingerprints = set()
    for amp in ("none", "bfloat16"):
        step, model, losses = run({"compile.scope": "regional", "fsdp.mp_policy": "bf16", "amp.dtype": amp})
        program = verify(step, model, "regional")
        assert program["coverage"] == 1.0
        fingerprints.add(program["fingerprint"])
        assert all(p.dtype == torch.float32 for p in model.parameters())  # the optimizer steps fp32 shards
        assert losses == pytest.approx(fp32, rel=2e-2) and losses != pytest.approx(fp32, rel=1e-6)  # computed in bf16
    step, model, _ = run({"compile.scope": "regional", "amp.dtype": "bfloat16"})
    fingerprints.add(verify(step, model, "regional")["fingerprint"])
    assert len(fingerprints) == 3  # bf16 parameters, and autocast over them, are programs of their own


def test_float16_autocast_runs_under_fsdp2_but_not_over_bf16_parameters() -> None:
    cuda = Env.detect("cuda", 2, False)  # float16 autocast is offered on CUDA; CPU autocast runs it too
    step, model, losses = run(TrialConfig.from_flat({**FSDP2, "compile.scope": "regional", **AOT,
                                                     "amp.dtype": "float16"}, cuda), grad_clip_norm=1.0)
    assert verify(step, model, "regional")["coverage"] == 1.0 and all(loss == loss for loss in losses)
    assert all(isinstance(p, DTensor) for p in model.parameters())  # the GradScaler stepped the shards
    both = TrialConfig(parallel=ParallelKnobs("fsdp2"), compile=CompileKnobs(scope="none"),
                       amp=AmpKnobs(dtype="float16"), fsdp=FsdpKnobs(mp_policy="bf16"))
    with pytest.raises(RuntimeError, match="mixed dtype"):
        run(both, steps=1)
    with pytest.raises(KnobError, match=r"amp\.dtype is not float16"):
        TrialConfig.from_flat({**FSDP2, "amp.dtype": "float16", "fsdp.mp_policy": "bf16"}, cuda)


@pytest.mark.parametrize("knobs", [
    {"compile.scope": "regional", "ac.policy": "block"},
    pytest.param({"compile.scope": "regional", "compile.optimizer": True, "optim.clip": "compiled"},
                 marks=pytest.mark.integration),  # 7 s: the compiled AdamW step over DTensors
    {"compile.scope": "regional", "compile.granularity": "sublayer", "optim.impl": "foreach"},
    pytest.param({"compile.scope": "train_step"}, marks=pytest.mark.integration),
])
def test_checkpointing_compiled_optimizer_clipping_and_train_step_combine_with_fsdp2(knobs: dict) -> None:
    _, _, eager = run({"compile.scope": "none"}, grad_clip_norm=1.0)
    step, model, losses = run(knobs, grad_clip_norm=1.0)
    assert verify(step, model, knobs["compile.scope"])["coverage"] == 1.0
    assert losses == pytest.approx(eager, rel=1e-5)


def test_accumulation_defers_the_gradient_reduction_to_the_last_micro_batch() -> None:
    step, model, losses = run({"compile.scope": "regional"}, grad_accum_steps=2)
    assert verify(step, model, "regional")["coverage"] == 1.0 and len(losses) == 6
    seen = []
    model.set_requires_gradient_sync = seen.append  # what the step asks of FSDP2 at each micro-batch
    data = SyntheticTokens(128, 2, [16], seed=0)
    for i in range(4):
        step(*data.batch(i))
    assert seen == [False, True, False, True]


def test_an_optimizer_built_before_sharding_is_refused() -> None:
    model = gpt2(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64)
    config = TrialConfig.from_flat({**FSDP2, "compile.scope": "none"}, TWO_RANKS)
    with pytest.raises(ValueError, match=r"functools.partial\(torch.optim.AdamW"):
        apply(model, torch.optim.AdamW(model.parameters()), lm_loss, config, distributed=True)


def test_the_knob_table_offers_the_fsdp2_questions_only_under_fsdp2() -> None:
    active = TrialConfig.from_flat({**FSDP2, "compile.scope": "regional"}, TWO_RANKS).active(TWO_RANKS)
    assert {"fsdp.order", "fsdp.reshard_after_forward", "fsdp.mp_policy"} <= set(active)
    assert not {"ddp.wrap_order", "ddp.optimize", "placement.order"} & set(active)
    ddp = TrialConfig.from_flat({"compile.scope": "module"}, TWO_RANKS).active(TWO_RANKS)
    assert ddp["parallel.strategy"] == "ddp" and not any(k.startswith("fsdp.") for k in ddp)
    assert "ddp.wrap_order" in ddp and "placement.order" in ddp
    for knobs, needs in [({"parallel.strategy": "fsdp2"}, "world size > 1"),
                         ({"fsdp.mp_policy": "bf16"}, "parallel.strategy is fsdp2")]:
        with pytest.raises(KnobError, match=needs):
            TrialConfig.from_flat(knobs, Env.detect("cpu", 1, False))
    for knobs, needs in [({**FSDP2, "ddp.optimize": "no_optimization"}, "parallel.strategy is ddp"),
                         ({**FSDP2, "placement.order": "compile_then_to"}, "moves the parameters"),
                         ({**FSDP2, "compile.scope": "train_step", "fsdp.order": "shard_then_compile"},
                          "compile.scope is module or regional"),
                         ({"fsdp.reshard_after_forward": False}, "parallel.strategy is fsdp2")]:
        with pytest.raises(KnobError, match=needs):
            TrialConfig.from_flat(knobs, TWO_RANKS)
    assert FsdpKnobs().order == "compile_then_shard"  # torchtitan's order is the default


# Two ranks through torchrun: every combination FSDP2 is offered in, checked against DDP's eager losses.
TWO_RANK_TRIALS: list[dict[str, Any]] = [
    {**FSDP2, "compile.scope": "none"},
    {**FSDP2, "compile.scope": "regional", "fsdp.order": "compile_then_shard", **AOT},
    {**FSDP2, "compile.scope": "regional", "fsdp.order": "shard_then_compile", **AOT},
    {**FSDP2, "compile.scope": "module", "fsdp.reshard_after_forward": False, **AOT},
    {**FSDP2, "compile.scope": "regional", "ac.policy": "block", "compile.optimizer": True, **AOT},
    {**FSDP2, "compile.scope": "train_step", **AOT},
    {**FSDP2, "compile.scope": "regional", "fsdp.mp_policy": "bf16", "amp.dtype": "bfloat16", **AOT},
]


@pytest.mark.integration
def test_fsdp2_trials_on_two_ranks_agree_with_ddp_and_compile_every_weight(tmp_path: Path) -> None:
    specs = [make_spec({"compile.scope": "none"}, nproc=2)] + [make_spec(k, nproc=2) for k in TWO_RANK_TRIALS]
    ddp, *results = run_trials(tmp_path, specs, parallel=1)
    assert_ok(ddp)
    for knobs, result in zip(TWO_RANK_TRIALS, results, strict=True):
        assert_ok(result)
        assert result["sharded"] == [*BLOCKS, "model"], knobs
        first, second = result["param_checksums"]
        assert first == second == pytest.approx(ddp["param_checksums"][0], rel=1e-2), knobs
        rtol = 2e-2 if knobs.get("fsdp.mp_policy") == "bf16" else 1e-4  # reduce-scattered like DDP's all-reduce
        assert result["losses"] == pytest.approx(ddp["losses"][:len(result["losses"])], rel=rtol), knobs
        assert result["compiled_coverage"] == (0.0 if knobs["compile.scope"] == "none" else 1.0), knobs
    assert results[1]["fingerprint"] == results[2]["fingerprint"]  # the two orders: one program


@pytest.mark.integration
def test_accumulation_and_clipping_under_fsdp2_match_ddp_on_two_ranks(tmp_path: Path) -> None:
    def accumulating(knobs: dict[str, Any]) -> Any:
        spec = make_spec(knobs, nproc=2)
        return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, grad_accum_steps=2,
                                                                      grad_clip_norm=1.0))

    ddp, sharded = run_trials(tmp_path, [accumulating({"compile.scope": "none"}),
                                         accumulating({**FSDP2, "compile.scope": "regional", **AOT})], parallel=1)
    assert_ok(ddp)
    assert_ok(sharded)
    n = min(len(ddp["losses"]), len(sharded["losses"]))
    assert sharded["losses"][:n] == pytest.approx(ddp["losses"][:n], rel=1e-4)


@pytest.mark.integration
def test_ddp_and_fsdp2_candidates_run_their_own_programs_side_by_side_on_two_ranks(tmp_path: Path) -> None:
    # compile.rest=eager: the rest's units (Embedding, LayerNorm, Linear: forwards defined inside torch) are
    # compiled through dynamo's one shared wrap_inline frame, so two regional candidates that compile them
    # cannot share a process whatever their strategy (the second sees the first's automatic-dynamic state).
    regional = {"compile.scope": "regional", "compile.rest": "eager", **AOT}
    candidates = [regional, {**FSDP2, **regional, "fsdp.order": "compile_then_shard"},
                  {**FSDP2, **regional, "fsdp.order": "shard_then_compile"},
                  {**FSDP2, **regional, "fsdp.mp_policy": "bf16"}]
    specs = [make_spec(k, model=TINY_GPT2, nproc=2) for k in candidates]
    alone = [launched(tmp_path / f"alone{i}", spec) for i, spec in enumerate(specs)]
    assert all(r["status"] == "ok" for r in alone), [(r.get("failure"), r.get("reason")) for r in alone]
    spec = SideBySideSpec(specs, ["ddp", "compile_then_shard", "shard_then_compile", "mp_bf16"],
                          expected=[r["fingerprint"] for r in alone], policy=QUICK_ROUNDS)
    together = launched(tmp_path / "together", spec)
    assert together["status"] == "ok", together
    assert [c["status"] for c in together["candidates"]] == ["ok"] * 4, together["candidates"]
    assert [c["fingerprint"] for c in together["candidates"]] == [r["fingerprint"] for r in alone]
    assert alone[1]["fingerprint"] == alone[2]["fingerprint"] != alone[0]["fingerprint"]


def test_the_shipped_fsdp2_experiment_composes_a_two_rank_study_that_asks_the_fsdp2_questions(
        settings_for: Any) -> None:
    from autocompile.config.space import SearchSpace

    both = settings_for("+model=gpt2-tiny", "+experiment=fsdp2")
    assert both.workload.world_size == 2 and not both.fixed_knobs
    assert both.study.verdicts == ["parallel.strategy", "fsdp.order", "fsdp.reshard_after_forward", "fsdp.mp_policy"]
    assert SearchSpace(both.env, {}).options("parallel.strategy", {}) == ("ddp", "fsdp2")
    sharded = settings_for("+model=gpt2-tiny", "+experiment=fsdp2", "parallel.strategy=fsdp2",
                           "compile.scope=regional")
    assert sharded.study.name.endswith("+parallel.strategy=fsdp2+compile.scope=regional")
    space = SearchSpace(sharded.env, sharded.fixed_knobs)
    values = TrialConfig.from_flat(sharded.fixed_knobs, sharded.env).flat()
    for key in ("fsdp.order", "fsdp.reshard_after_forward", "fsdp.mp_policy"):
        assert len(space.options(key, values)) == 2, key
