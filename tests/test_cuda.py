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
from autocompile.trial.step import TrainStep, apply, lm_loss
from autocompile.trial.worker import peak_flops
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

    from autocompile.trial.build import build_candidate, period, stage, tensors, warm_up

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

    from autocompile.trial.clock import WindowClock

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
