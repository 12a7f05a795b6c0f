"""Each part apply() composes, called alone on a tiny model (eager and aot_eager backends, in-process), and the
inductor cache-key listener that is attached only while a step compiles."""

from __future__ import annotations

import functools
import logging
import socket
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autocompile.config.knobs import (
    AcKnobs,
    AmpKnobs,
    CompileKnobs,
    DdpKnobs,
    Env,
    OptimKnobs,
    PlacementKnobs,
    TrialConfig,
)
from autocompile.trial.program import apply_parts as parts
from autocompile.trial.program.graphs import CODECACHE, CompileLog, listening, verify
from autocompile.trial.program.step import (
    Micro,
    apply,
    compile_kwargs,
    eager_step,
    lm_loss,
    optimizer_update,
    scaled_backward,
)
from autocompile.workload.data import SyntheticTokens
from tests.models import tiny_lm

CPU = torch.device("cpu")


def compilers(backend: str = "eager") -> parts.Compilers:
    return parts.Compilers(CompileLog(), compile_kwargs(CompileKnobs(backend=backend)))


def test_ac_checkpoints_every_block_with_children_and_nothing_else() -> None:
    model = tiny_lm()
    parts.apply_ac(model, AcKnobs(policy="none"))
    assert not any("forward" in m.__dict__ for m in model.modules())
    parts.apply_ac(model, AcKnobs(policy="block"))
    assert ["forward" in b.__dict__ for b in model.blocks] == [True, True]
    calls = []
    model.blocks[0].linear.register_forward_pre_hook(lambda *_: calls.append(1))
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    assert len(calls) == 2  # the block's forward runs again in backward


def test_compile_targets_follow_scope_granularity_and_rest() -> None:
    model = tiny_lm()
    assert parts.compile_targets(model, CompileKnobs(scope="none")) == []
    assert parts.compile_targets(model, CompileKnobs(scope="train_step")) == []
    assert parts.compile_targets(model, CompileKnobs(scope="module")) == [("model", model)]
    regional = parts.compile_targets(model, CompileKnobs(scope="regional"))
    assert [name for name, _ in regional] == ["blocks.0", "blocks.1", "embed", "head"]
    eager_rest = parts.compile_targets(model, CompileKnobs(scope="regional", rest="eager"))
    assert [name for name, _ in eager_rest] == ["blocks.0", "blocks.1"]
    sub = parts.compile_targets(model, CompileKnobs(scope="regional", granularity="sublayer", rest="eager"))
    assert [name for name, _ in sub] == ["blocks.0.linear", "blocks.1.linear"]
    nested = tiny_lm()
    class_forward = type(nested.blocks[0]).forward
    assert parts.compile_targets(nested, CompileKnobs(scope="regional", granularity="nested")) == [("model", nested)]
    assert all("forward" in b.__dict__ for b in nested.blocks)  # each block marked a region...
    assert type(nested.blocks[0]).forward is class_forward  # ...the class left as it was


@pytest.mark.parametrize(("scope", "placement", "units", "outer", "inner"), [
    ("module", "outside", False, True, False),
    ("module", "inside", True, False, False),
    ("regional", "inside", True, True, False),  # the eager rest keeps the outer context
    ("train_step", "inside", False, False, True),
    ("train_step", "outside", False, True, False),
    ("none", "inside", False, True, False),  # nothing compiled: the eager step's own autocast
])
def test_autocast_sits_where_placement_says(scope: str, placement: str, units: bool, outer: bool, inner: bool) -> None:
    amp = AmpKnobs(dtype="bfloat16", placement=placement)
    unit = nn.Linear(4, 4)
    parts.apply_autocast([("unit", unit)], amp, scope, CPU)
    assert (unit(torch.ones(1, 4)).dtype == torch.bfloat16) is units
    with parts.outer_autocast(amp, scope, CPU)():
        assert torch.is_autocast_enabled("cpu") is outer
    assert (parts.inner_autocast(amp, scope) is torch.bfloat16) is inner
    plain = AmpKnobs(dtype="none", placement=placement)
    assert parts.inner_autocast(plain, scope) is None
    with parts.outer_autocast(plain, scope, CPU)():
        assert not torch.is_autocast_enabled("cpu")


def test_optimize_ddp_is_set_and_reported_only_when_distributed() -> None:
    with torch._dynamo.config.patch(optimize_ddp=True):
        assert parts.apply_optimize_ddp(DdpKnobs(optimize="python_reducer"), distributed=False) == {}
        assert torch._dynamo.config.optimize_ddp is True
        settings = parts.apply_optimize_ddp(DdpKnobs(optimize="python_reducer"), distributed=True)
        assert settings == {"optimize_ddp": "python_reducer"} == {"optimize_ddp": torch._dynamo.config.optimize_ddp}
    assert parts.compiles_ddp(DdpKnobs(wrap_order="compile_of_ddp"), "module", True)
    assert not parts.compiles_ddp(DdpKnobs(wrap_order="compile_of_ddp"), "module", False)
    assert not parts.compiles_ddp(DdpKnobs(wrap_order="compile_of_ddp"), "regional", True)


class Moves(nn.Module):
    """Notes when ``.to()`` reaches it, so the order of placement and compilation shows."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.events = events

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.events.append("to")
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


@pytest.mark.parametrize(("order", "expected"), [("compile_then_to", ["compile", "to"]),
                                                 ("to_then_compile", ["to", "compile"])])
def test_placement_orders_compile_and_to(order: str, expected: list[str]) -> None:
    events: list[str] = []
    model, c = Moves(events), compilers()
    log, compile_model = c.log, c("model")

    def noted(fn: Any) -> Any:
        events.append("compile")
        return compile_model(fn)

    assert parts.place_and_compile(model, [("model", model)], PlacementKnobs(order=order), CPU, noted, log) == ["model"]
    assert events == expected
    model(torch.ones(1, 4))
    assert log.calls == {"model": 1} and log.graphs  # the compiled forward ran, counted
    events.clear()
    assert parts.place_and_compile(model, [], PlacementKnobs(order="compile_then_to"), CPU, noted, log) == []
    assert events == ["to"]  # nothing to compile (compile_of_ddp compiles the DDP wrapper later)


def test_optimizer_gets_its_implementation_and_a_tensor_lr_only_where_a_scheduled_step_is_compiled() -> None:
    model = nn.Linear(4, 4)
    factory = functools.partial(torch.optim.AdamW, lr=0.1)
    schedule = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    opt, sched = parts.apply_optim(factory, model, OptimKnobs(impl="foreach"), schedule, True, CPU)
    assert opt.param_groups[0]["foreach"] is True and isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR) and sched.optimizer is opt
    opt, _ = parts.apply_optim(factory, model, OptimKnobs(impl="for_loop"), schedule, False, CPU)
    assert isinstance(opt.param_groups[0]["lr"], float)  # eager step: a float LR
    opt, sched = parts.apply_optim(factory, model, OptimKnobs(impl="default", tensor_lr=False), None, True, CPU)
    assert isinstance(opt.param_groups[0]["lr"], float) and sched is None
    assert parts.step_compiled(CompileKnobs(scope="train_step"))
    assert parts.step_compiled(CompileKnobs(scope="regional", optimizer=True))
    assert not parts.step_compiled(CompileKnobs(scope="module"))


def test_clipping_and_scaler_exist_only_when_asked() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert parts.clipping(opt, 0.0) is None
    model(torch.ones(1, 4) * 100).sum().backward()
    clip = parts.clipping(opt, 1.0)
    assert clip is not None and float(clip()) > 1.0
    assert float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])) == pytest.approx(1.0, rel=1e-5)
    assert parts.grad_scaler(AmpKnobs(dtype="float16"), CPU) is not None
    assert parts.grad_scaler(AmpKnobs(dtype="bfloat16"), CPU) is None


@pytest.mark.parametrize(("optimizer", "clip", "left", "names"), [
    (True, "compiled", False, ["optimizer.step+clip_grad_norm_"]),
    (True, "eager", True, ["optimizer.step"]),
    (False, "compiled", True, ["clip_grad_norm_"]),
    (False, "eager", True, []),
])
def test_compiled_update_takes_the_clipping_in_or_compiles_it_alone(optimizer: bool, clip: str, left: bool,
                                                                     names: list[str]) -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    c = compilers("aot_eager")
    knobs = CompileKnobs(scope="module", optimizer=optimizer)
    remaining, compiled = parts.apply_compiled_update(opt, parts.clipping(opt, 1.0), knobs, OptimKnobs(clip=clip), c)
    assert compiled == names and (remaining is not None) is left
    model(torch.ones(1, 4) * 100).sum().backward()
    if remaining is not None:
        remaining()
    opt.step()
    expected = ({"optimizer"} if optimizer else set()) | ({"clip"} if names == ["clip_grad_norm_"] else set())
    assert c.log.roles() == expected  # each compiled part produced its graph
    assert parts.apply_compiled_update(opt, None, CompileKnobs(scope="none"), OptimKnobs(clip="compiled"), c) \
        == (None, [])


def test_compiled_autograd_only_on_compiled_units() -> None:
    context, names = parts.compiled_autograd(CompileKnobs(scope="module", compiled_autograd=True), compilers())
    assert names == ["compiled_autograd"] and context is not nullcontext
    assert parts.compiled_autograd(CompileKnobs(scope="train_step", compiled_autograd=True), compilers()) \
        == (nullcontext, [])


def test_micro_steps_step_the_optimizer_and_schedule_every_accum_calls() -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    steps: list[int] = []
    opt.register_step_post_hook(lambda *_: steps.append(1))
    micro = Micro(model, lambda out, _: out.sum(), scaled_backward(None, 3), optimizer_update(opt, None, None, False),
                  3, None, sched, cuda_graphs=False)
    step = eager_step(micro, nullcontext, nullcontext)
    weights = []
    for _ in range(6):
        step(torch.ones(1, 4), None)
        weights.append(model.weight.detach().clone())
    assert len(steps) == 2 and opt.param_groups[0]["lr"] == 0.25  # two optimizer steps, two schedule steps
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])


def test_accumulated_micro_batches_give_the_full_batch_gradient() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    full, halves = nn.Linear(3, 1), nn.Linear(3, 1)
    halves.load_state_dict(full.state_dict())
    full(x).mean().backward()
    backward = scaled_backward(None, 2)
    for part in x.split(2):
        backward(halves(part).mean())
    torch.testing.assert_close(halves.weight.grad, full.weight.grad)


def test_float16_update_unscales_before_clipping_so_clipping_sees_true_gradients() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    norms: list[float] = []

    def clip() -> None:
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1e9)))

    scaled_backward(scaler, 1)(model(torch.ones(1, 4)).sum())
    true_norm = float(torch.nn.utils.get_total_norm([p.grad / 1024.0 for p in model.parameters()]))
    optimizer_update(opt, scaler, clip, unscale=True)()
    assert norms == [pytest.approx(true_norm, rel=1e-5)]
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step


def test_compile_of_ddp_compiles_the_wrapper_and_every_weight_runs_in_its_graph() -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with torch._dynamo.config.patch(optimize_ddp=True):
            env = Env.detect("cpu", 2, False)
            knobs = {"compile.scope": "module", "compile.backend": "aot_eager", "ddp.wrap_order": "compile_of_ddp",
                     "ddp.optimize": "no_optimization"}
            config = TrialConfig.from_flat(knobs, env)
            torch._dynamo.reset()
            model = tiny_lm()
            step = apply(model, functools.partial(torch.optim.AdamW, lr=1e-3), lm_loss, config, distributed=True)
            assert step.compiled == ["DistributedDataParallel(model)"]
            assert step.settings == {"optimize_ddp": False} and torch._dynamo.config.optimize_ddp is False
            assert isinstance(step.model._orig_mod, nn.parallel.DistributedDataParallel)  # compile wraps DDP
            step(*SyntheticTokens(64, 2, [8], seed=0).batch(0))
            assert verify(step, model, "module")["coverage"] == 1.0
    finally:
        dist.destroy_process_group()


KEY_LINE = "fx graph cache miss for key %s"  # torch._inductor.codecache's line (INFO in torch 2.13)


def test_each_listening_window_collects_its_own_keys_and_restores_the_logger() -> None:
    logger = logging.getLogger(CODECACHE)
    before = (logger.level, logger.propagate, list(logger.handlers))
    first, second = CompileLog(), CompileLog()
    with listening(first):
        logger.info(KEY_LINE, "a1")
        logger.info("fx graph cache hit for key %s", "a2")
    with listening(second):  # side by side: the next candidate warms up in the same process
        logger.info(KEY_LINE, "b1")
    logger.info(KEY_LINE, "after")  # nobody listens: nobody collects
    assert first.inductor_keys == ["a1", "a2"] and second.inductor_keys == ["b1"]
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    with pytest.raises(RuntimeError), listening(CompileLog()):
        raise RuntimeError("a failed warm-up")
    assert (logger.level, logger.propagate, list(logger.handlers)) == before


def test_importing_autocompile_leaves_the_codecache_logger_alone() -> None:
    code = """
import logging, torch, torch._inductor.codecache
logger = logging.getLogger("torch._inductor.codecache")
state = lambda: (logger.level, logger.propagate, list(logger.handlers))
before = state()
import autocompile, autocompile.trial.program.graphs, autocompile.trial.program.step, autocompile.trial.program.build
autocompile.apply
assert state() == before, (before, state())
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)


@pytest.mark.integration
def test_inductor_keys_are_attributed_to_the_step_that_compiled_them() -> None:
    """Real inductor compiles, one step after another in one process as the side-by-side worker builds them."""
    env = Env.detect("cpu", 1, False)
    logs = []
    for scope in ("module", "module", "regional"):
        torch._dynamo.reset()
        config = TrialConfig.from_flat({"compile.scope": scope, "compile.backend": "inductor"}, env)
        torch.manual_seed(0)
        model = tiny_lm()
        step = apply(model, torch.optim.SGD(model.parameters(), lr=0.1), lm_loss, config)
        with listening(step.log):
            step(*SyntheticTokens(64, 2, [8], seed=0).batch(0))
        logs.append(step.log)
        assert verify(step, model, scope)
    assert all(log.inductor_keys for log in logs)
    assert set(logs[0].inductor_keys) == set(logs[1].inductor_keys)  # one program: the same keys, a cache hit
    assert not set(logs[1].inductor_keys) & set(logs[2].inductor_keys)  # another program: its own keys only
