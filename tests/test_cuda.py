"""The GPU-only paths: CUDA-graph modes in every scope, checkpointing under CUDA graphs, fp16 with
its GradScaler, and what the worker measures on a GPU (allocator peak memory, MFU).

Skipped without CUDA; ``pytest -m cuda`` runs only these (``scripts/gpu_check.py`` does, on the GPU
box). Tiny models, so each test compiles in seconds; max-autotune takes longer (it benchmarks
kernel choices even for tiny matmuls).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autocompile.config.knobs import Env, TrialConfig
from autocompile.trial.program.step import TrainStep, apply, lm_loss
from autocompile.trial.timing.readings import peak_flops
from autocompile.workload.data import SyntheticTokens
from autocompile.workload.models import gpt2
from tests.conftest import TINY_GPT2, assert_ok, make_spec, run_trials

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STEPS = 8
# fp32 eager vs inductor on the GPU: fused kernels reorder reductions, Adam amplifies that a little.
# A step that does not train drifts ~6% by step 8 on this data, so 0.2% still catches it.
FP32_RTOL = 2e-3
FP16_RTOL = 1e-2


def train(knobs: dict[str, Any], steps: int = STEPS) -> tuple[TrainStep, list[float]]:
    """``steps`` steps of a 2-layer GPT-2 on the GPU; losses kept as tensors and read at the end, as the
    worker does: a loss living in CUDA-graph memory that a later replay overwrote raises right there."""
    torch._dynamo.reset()  # also resets the CUDA-graph trees of earlier tests
    config = TrialConfig.from_flat({"compile.scope": "none", **knobs}, Env.detect("cuda", 1, False))
    torch.manual_seed(0)
    model = gpt2(**TINY_GPT2.kwargs)
    step = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss, config, device="cuda")
    data = SyntheticTokens(TINY_GPT2.vocab_size, 4, [32], seed=0, device="cuda")
    losses = [step(*data.batch(i)) for i in range(steps)]
    return step, torch.stack(losses).float().cpu().tolist()


@pytest.fixture
def cuda_graph_recordings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many graphs the CUDA-graph trees recorded: a cudagraph mode must really use CUDA graphs
    (inductor silently falls back to plain kernels when it declines, counting a cudagraph_skip)."""
    from torch._inductor import cudagraph_trees

    recorded: list[int] = []
    original = cudagraph_trees.CUDAGraphTreeManager.record_function

    def record_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorded.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cudagraph_trees.CUDAGraphTreeManager, "record_function", record_function)
    return recorded


@pytest.fixture(scope="module")
def eager_fp32() -> list[float]:
    return train({"compile.scope": "none"})[1]


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("scope", ["module", "regional", "train_step"])
def test_cuda_graph_modes_in_every_scope_match_eager(scope: str, mode: str, eager_fp32: list[float],
                                                     cuda_graph_recordings: list[int]) -> None:
    step, losses = train({"compile.scope": scope, "compile.mode": mode})
    assert step.compiled
    assert cuda_graph_recordings, f"{scope}/{mode}: no CUDA graph was recorded"
    assert losses == pytest.approx(eager_fp32, rel=FP32_RTOL)
    assert eager_fp32[-1] < eager_fp32[0] * 0.97  # the reference really trained: the tolerance means something


@pytest.mark.parametrize("scope", ["module", "regional"])
def test_activation_checkpointing_under_cuda_graphs_matches_eager(scope: str, eager_fp32: list[float],
                                                                  cuda_graph_recordings: list[int]) -> None:
    _, losses = train({"compile.scope": scope, "compile.mode": "reduce-overhead", "ac.policy": "block"})
    assert cuda_graph_recordings
    assert losses == pytest.approx(eager_fp32, rel=FP32_RTOL)


def test_fp16_steps_through_a_grad_scaler_and_matches_eager_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    scalers: list[torch.amp.GradScaler] = []

    class RecordingScaler(torch.amp.GradScaler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            scalers.append(self)

    monkeypatch.setattr(torch.amp, "GradScaler", RecordingScaler)
    _, eager = train({"compile.scope": "none", "amp.dtype": "float16"})
    step, compiled = train({"compile.scope": "module", "amp.dtype": "float16"})
    assert step.compiled == ["model"]
    assert len(scalers) == 2 and all(s.is_enabled() for s in scalers)
    scale = scalers[-1].get_scale()
    assert 0 < scale < float("inf")  # it scaled and updated (a NaN/inf gradient halves it, never zeroes it)
    assert compiled == pytest.approx(eager, rel=FP16_RTOL)
    assert compiled[-1] < compiled[0]


def test_worker_measures_allocator_peak_memory_and_mfu_on_the_gpu(tmp_path: Path) -> None:
    specs = [make_spec({"compile.scope": "module"}, device="cuda", windows=3),
             # The worker's own loop: losses stacked after the timed part, out of CUDA-graph memory.
             make_spec({"compile.scope": "train_step", "compile.mode": "reduce-overhead"}, device="cuda", windows=3)]
    name = torch.cuda.get_device_name(0)
    for result in run_trials(tmp_path, specs):
        assert_ok(result)
        assert result["environment"]["device"] == "cuda" and result["environment"]["device_name"] == name
        # torch.cuda.max_memory_allocated: a few MiB for this model; a CUDA process's RSS is over 1 GiB.
        assert 0 < result["peak_memory_bytes"] < 256 * 2**20
        peak = peak_flops(name)
        if peak:
            assert result["mfu"] == pytest.approx(result["flops_per_token"] * result["tokens_per_s"] / peak)
            assert 0 < result["mfu"] < 1
        else:
            assert result["mfu"] is None  # an unknown GPU gets no made-up MFU (measure.peak_tflops sets one)


def test_hopper_gpus_get_their_bf16_peak() -> None:
    name = torch.cuda.get_device_name(0)
    if "H100" in name.upper() or "H200" in name.upper():
        assert peak_flops(name) in (989e12, 835e12, 756e12)  # SXM, H200, GH200: 989 TFLOP/s dense; NVL: 835; PCIe: 756


# --- issue 27: measurement (gpu-measure) ---


def test_staged_batches_live_on_the_gpu_and_the_timed_steps_copy_nothing_from_pageable_memory() -> None:
    from torch.profiler import ProfilerActivity, profile

    from autocompile.trial.program.build import build_candidate, period, stage, tensors, warm_up

    spec = make_spec({"compile.scope": "none"}, device="cuda")
    device = torch.device("cuda", torch.cuda.current_device())
    built = build_candidate(spec, TrialConfig.from_flat(spec.knobs, Env.detect("cuda", 1, False)), device, 0, 1)
    built.staged = stage(built.data, period(spec), device)
    assert all(t.is_cuda for batch in built.staged for t in tensors(batch))
    warm_up(built, 3, torch.cuda.synchronize, lambda *a, **k: None)

    def made_while_timing(step: int) -> Any:
        raise AssertionError(f"batch {step} made in the timed part")

    built.data = made_while_timing
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        built.run(6, torch.cuda.synchronize)
    pageable = [e.name for e in prof.events() if "HtoD" in e.name and "Pageable" in e.name]
    assert not pageable, pageable  # such a copy waits for the queued kernels: each step's launches go serial


def test_event_window_times_agree_with_a_synchronised_wall_clock_over_the_timed_part() -> None:
    import time

    from autocompile.trial.timing.clock import WindowClock

    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        b = a @ a  # cuBLAS handle and workspace before timing
    torch.cuda.synchronize()
    clock = WindowClock(torch.device("cuda"), torch.cuda.synchronize)
    t0 = time.perf_counter()
    for _ in range(12):
        clock.start()
        for _ in range(8):
            b = a @ a
        clock.stop()
    assert clock.pending == 12  # nothing read, nothing synchronised between windows
    seconds = clock.resolve()
    wall = time.perf_counter() - t0
    assert clock.pending == 0 and len(seconds) == 12 and b.isfinite().all()
    assert sum(seconds) == pytest.approx(wall, rel=0.05)  # GPU-bound: the events see what the wall clock sees


def test_worker_reads_steady_state_memory_after_the_warm_up_on_the_gpu(tmp_path: Path) -> None:
    spec = make_spec({"compile.scope": "module"}, device="cuda", windows=3)
    (result,) = run_trials(tmp_path, [spec])
    assert_ok(result)
    assert "after the warm-up" in result["memory_source"] and result["windows"] >= 3
    assert result["peak_memory_bytes"] > 0 and result["warmup_peak_memory_bytes"] > 0


# --- issue 27: tuner side (gpu-tuner) ---


def test_the_tuner_side_reads_the_gpu_without_initialising_cuda() -> None:
    """In a fresh process (this one has CUDA up): what the tuner reads about its GPUs leaves CUDA uninitialised
    (no context on GPU 0 for the whole study), and reads the same name and a free memory the worker would."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import torch\n"
            "from autocompile.config.gpus import check_triton, free_memory, gpu_name, visible_gpus\n"
            "from autocompile.config.spec import Workload\n"
            "from autocompile.workload.parts import knob_facts\n"
            "impls = knob_facts(Workload(), 'cuda')['optimizer_impls']\n"
            "print(gpu_name(), '|', free_memory(visible_gpus()[0]), '|', check_triton(), '|', impls)\n"
            "print(torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True).stdout.strip().splitlines()
    name, free, problem, impls = out[-2].split(" | ")
    assert out[-1] == "False", out
    assert name == torch.cuda.get_device_name(0)
    assert 0 < float(free) <= torch.cuda.get_device_properties(0).total_memory
    assert problem == "None" and "fused" in impls

# --- issue 27: step and knob rules (gpu-step) ---


def _gpt2_step(config: TrialConfig, loss_fn: Any = lm_loss) -> tuple[TrainStep, torch.nn.Module, SyntheticTokens]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = gpt2(**TINY_GPT2.kwargs)
    step = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loss_fn, config, device="cuda")
    return step, model, SyntheticTokens(TINY_GPT2.vocab_size, 4, [32], seed=0, device="cuda")


def _accumulated(graphed: bool, steps: int = 3, micro_batches: int = 2) -> list[torch.Tensor]:
    """What a CUDA-graph mode with accumulation would run: a step marked per micro-batch, gradients summed by
    AccumulateGrad over the micro-batches, then an SGD step. Returns the parameters after ``steps``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).cuda()
    run = torch.compile(model, mode="reduce-overhead") if graphed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(steps * micro_batches, 8, 16, generator=torch.Generator().manual_seed(0)).cuda()
    for i, x in enumerate(batches):
        torch.compiler.cudagraph_mark_step_begin()
        run(x).square().mean().backward()
        if i % micro_batches == micro_batches - 1:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def test_cuda_graphs_still_overwrite_accumulated_gradients_on_this_torch() -> None:
    """Finding 1's rule (no CUDA-graph mode with workload.grad_accum_steps > 1; apply() refuses) rests on this:
    each micro-batch's replay overwrites the gradients AccumulateGrad kept from the graph pool (pytorch#169545).
    If this fails, this torch accumulates correctly under CUDA graphs: offer the modes again (knobs._modes,
    step.accumulation_error)."""
    eager = _accumulated(graphed=False)
    try:
        graphed = _accumulated(graphed=True)
    except RuntimeError as exc:
        assert "overwritten" in str(exc)
        return
    assert not all(torch.allclose(g, e, rtol=1e-4, atol=1e-6) for g, e in zip(graphed, eager, strict=True))


def test_accumulating_in_a_cuda_graph_mode_is_neither_offered_nor_built() -> None:
    from autocompile.config.knobs import KNOBS
    from autocompile.config.spec import Workload
    from autocompile.workload.parts import knob_facts

    accumulating = Env.detect("cuda", 1, False, job=knob_facts(Workload(grad_accum_steps=2), "cuda"))
    offered = KNOBS["compile.mode"][0].allowed(TrialConfig().flat(), accumulating)
    assert "default" in offered and not {"reduce-overhead", "max-autotune"} & set(offered)
    config = TrialConfig.from_flat({"compile.mode": "reduce-overhead"}, Env.detect("cuda", 1, False))
    model = gpt2(**TINY_GPT2.kwargs)
    with pytest.raises(ValueError, match="grad_accum_steps=1"):
        apply(model, torch.optim.AdamW(model.parameters()), lm_loss, config, device="cuda", grad_accum_steps=2)


def test_a_loss_the_model_computes_inside_a_cuda_graph_survives_later_replays(
        cuda_graph_recordings: list[int]) -> None:
    """Finding 3: under module scope ``output.loss`` is a CUDA-graph output; the step hands back a copy, so
    losses kept over steps and read at the end (as the worker does) are each step's own."""
    from autocompile.workload.losses import model_loss

    def losses(knobs: dict[str, Any]) -> list[float]:
        config = TrialConfig.from_flat({"compile.scope": "none", **knobs}, Env.detect("cuda", 1, False))
        step, _, data = _gpt2_step(config, model_loss)
        kept = [step({"input_ids": data.batch(i)[0], "labels": data.batch(i)[0]}, None) for i in range(STEPS)]
        return torch.stack(kept).float().cpu().tolist()

    eager = losses({"compile.scope": "none"})
    graphed = losses({"compile.scope": "module", "compile.mode": "reduce-overhead"})
    assert cuda_graph_recordings
    assert graphed == pytest.approx(eager, rel=FP32_RTOL)
    assert len(set(graphed)) == len(graphed)  # not one overwritten value read STEPS times


def test_cuda_graph_recordings_and_re_recordings_are_counted(cuda_graph_recordings: list[int]) -> None:
    """Finding 4: the worker counts recordings with the frames it compiles; a static input that moves (FSDP2
    re-allocates its parameters' storage, pytorch#183451) makes the tree record again."""
    from autocompile.trial.timing.recordings import cudagraph_recordings

    config = TrialConfig.from_flat({"compile.mode": "reduce-overhead"}, Env.detect("cuda", 1, False))
    step, model, data = _gpt2_step(config)
    start = cudagraph_recordings()
    for i in range(3):  # a graph's first call warms up, its second records
        step(*data.batch(i))
    warm = cudagraph_recordings() - start
    assert warm == len(cuda_graph_recordings) > 0
    for i in range(3, 6):
        step(*data.batch(i))
    assert cudagraph_recordings() - start == warm  # steady state: replays only
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
    step(*data.batch(6))
    assert cudagraph_recordings() - start == len(cuda_graph_recordings) > warm


def test_fp16_train_step_in_a_cuda_graph_mode_keeps_its_cuda_graphs() -> None:
    """Finding 7, rejected on an H100 with torch 2.11: GradScaler.update() inside the compiled train step did not
    make inductor skip CUDA graphs (0 cudagraph_skips), so the combination stays offered; its losses match eager
    float16 (a torch that skips fails such trials as cudagraphs_skipped)."""
    from torch._dynamo.utils import counters

    cuda = Env.detect("cuda", 1, False)
    fp16 = {"compile.scope": "train_step", "compile.mode": "reduce-overhead", "amp.dtype": "float16"}

    def run(config: TrialConfig) -> tuple[int, list[float]]:
        step, _, data = _gpt2_step(config)
        counters.clear()
        losses = [step(*data.batch(i)) for i in range(STEPS)]
        return int(counters["inductor"]["cudagraph_skips"]), torch.stack(losses).float().cpu().tolist()

    skips, graphed = run(TrialConfig.from_flat(fp16, cuda))
    _, eager = run(TrialConfig.from_flat({"compile.scope": "none", "amp.dtype": "float16"}, cuda))
    assert skips == 0
    assert graphed == pytest.approx(eager, rel=FP16_RTOL)
