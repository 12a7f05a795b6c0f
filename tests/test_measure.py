"""What the workers measure (issue 27): batches staged before the warm-up, the window clock, steady-state
memory read after the warm-up, side-by-side ranks agreeing on failed candidates, the float32 matmul
precision of the job, GPU out-of-memory forms, peaks for MFU and threads from the affinity mask."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autocompile.config.space import SearchSpace
from autocompile.config.spec import SideBySideSpec, TrialSpec, Workload
from autocompile.report.export.frameworks import accelerate_yaml, trainer_arguments
from autocompile.report.export.snippet import snippet
from autocompile.report.export.torchtitan import torchtitan_toml
from autocompile.trial.program import build as build_module
from autocompile.trial.program.build import stage
from autocompile.trial.timing import worker
from autocompile.trial.timing.clock import LAZY_WINDOWS, WindowClock
from autocompile.trial.timing.readings import classify, peak_flops
from autocompile.workload.data import SyntheticTokens
from tests.conftest import QUICK_ROUNDS, ROOT, launched, make_spec, tiny_lm
from tests.test_frameworks import make_winner
from tests.test_report import best_entry

CALLS: list[tuple[int, bool]] = []
"""(step, whether the warm-up had started) of every call of :func:`recorded_tokens` in this process."""
WARMING: dict[str, bool] = {"started": False}


def recorded_tokens(step: int, batch_size: int, seq_len: list[int], seed: int, device: Any,
                    vocab_size: int) -> tuple[Any, Any]:
    """The synthetic tokens, each call recorded."""
    CALLS.append((step, WARMING["started"]))
    return SyntheticTokens(vocab_size, batch_size, seq_len, seed, device=device).batch(step)


@pytest.fixture(scope="module")
def in_process_trial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One eager trial run by the worker's own code in this process, with the warm-up and the start of the
    steady-state memory reading watched (the real functions, called through)."""
    spec = make_spec({"compile.scope": "none"}, windows=3)
    spec = dataclasses.replace(spec, workload=dataclasses.replace(
        spec.workload, data={"_target_": "tests.test_measure.recorded_tokens"}))
    trial_dir = tmp_path_factory.mktemp("trial")
    seen: dict[str, Any] = {}

    def warm_up(*args: Any, **kwargs: Any) -> None:
        WARMING["started"] = True
        worker_warm_up(*args, **kwargs)

    def reset_peak_memory(device: torch.device) -> str:
        seen["events_at_reset"] = [json.loads(line)["event"] for line in (trial_dir / "progress.jsonl").open()]
        return worker_reset(device)

    worker_warm_up, worker_reset = worker.warm_up, worker.reset_peak_memory
    CALLS.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker, "warm_up", warm_up)
        mp.setattr(worker, "reset_peak_memory", reset_peak_memory)
        result = worker.Trial(spec, trial_dir, 0).run().to_json()
    yield {"result": result, "calls": list(CALLS), **seen}
    WARMING["started"] = False


def test_batches_are_made_before_the_warm_up_and_none_while_timing(in_process_trial: dict[str, Any]) -> None:
    result, calls = in_process_trial["result"], in_process_trial["calls"]
    assert result["status"] == "ok" and result["warmup_steps"] + 3 * result["window_steps"] <= build_module.STAGED_STEPS
    assert calls, "the data part was never called"
    assert not [step for step, warming in calls if warming], "batches were made during the warm-up or timed part"
    assert [step for step, _ in calls] == list(range(build_module.STAGED_STEPS))  # each step's batch made once


def test_steady_state_memory_is_read_after_the_warm_up(in_process_trial: dict[str, Any]) -> None:
    events, result = in_process_trial["events_at_reset"], in_process_trial["result"]
    assert "compiled" in events and events.count("warmup_step") == result["warmup_steps"]
    assert "window" not in events  # before the first timed window
    # CPU: the process's maximum RSS cannot be reset; the result says where its numbers come from.
    assert "cannot be reset" in result["memory_source"]
    assert 0 < result["warmup_peak_memory_bytes"] <= result["peak_memory_bytes"]


def test_staged_batches_are_whole_periods_within_their_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    data = SyntheticTokens(64, 2, [8, 12, 16], seed=0)
    staged = stage(data, 3, torch.device("cpu"))
    assert len(staged) == 66  # STAGED_STEPS rounded up to whole periods of 3 lengths
    one_period = sum(t.numel() * t.element_size() for i in range(3) for t in data(i))
    monkeypatch.setattr(build_module, "STAGED_BYTES", 2 * one_period + 1)
    staged = stage(data, 3, torch.device("cpu"))
    assert len(staged) == 6
    for i, (inputs, targets) in enumerate(staged):  # step i's batch is data(i): the same for every candidate
        assert torch.equal(inputs, data(i)[0]) and torch.equal(targets, data(i)[1])
    monkeypatch.setattr(build_module, "STAGED_BYTES", 1)
    assert len(stage(data, 3, torch.device("cpu"))) == 3  # never less than one period


def test_the_wall_clock_synchronises_both_ends_of_each_window_and_decides_every_window() -> None:
    syncs: list[int] = []
    clock = WindowClock(torch.device("cpu"), lambda: syncs.append(1))
    assert not clock.events
    for w in range(3):
        clock.start()
        assert len(syncs) == 2 * w + 1  # synchronised before the clock reads, as before
        assert clock.stop() == w
        assert clock.pending == 0 and len(clock.seconds) == w + 1  # known at once
    assert len(syncs) == 6 and all(s >= 0 for s in clock.resolve())
    assert clock.before_deciding(0, 5) == 1 and clock.before_deciding(7, 5) == 1
    with pytest.raises(RuntimeError):
        clock.stop()


def test_on_cuda_the_clock_runs_the_minimum_then_a_few_windows_per_decision() -> None:
    clock = WindowClock(torch.device("cuda"), lambda: None)  # no CUDA call until a window starts
    assert clock.events
    assert clock.before_deciding(0, 5) == 5 and clock.before_deciding(2, 5) == 3
    assert clock.before_deciding(5, 5) == LAZY_WINDOWS and clock.before_deciding(9, 5) == LAZY_WINDOWS


def test_ranks_drop_a_candidate_that_failed_on_one_rank_together(tmp_path: Path) -> None:
    """Two gloo ranks; the middle candidate's loss is NaN on rank 1 only (from its second warm-up step, after
    that step's collectives): every rank drops it, the other two are timed side by side on both ranks."""
    eager = {"compile.scope": "none"}
    specs = [make_spec(eager, model=tiny_lm(), nproc=2), make_spec(eager, model=tiny_lm("nan_late_on_rank1"), nproc=2),
             make_spec(eager, model=tiny_lm(), nproc=2)]
    spec = SideBySideSpec(specs, ["a", "nan_on_rank1", "b"], policy=dataclasses.replace(QUICK_ROUNDS, max_timed_s=0.5),
                          timeout_s=120)
    result = launched(tmp_path / "sbs", spec)
    assert result["status"] == "ok", result
    a, failed, b = result["candidates"]
    assert failed["status"] == "failed" and failed["failure"] == "nan_loss", failed
    assert failed["reason"].startswith("on rank 1:")  # rank 0, which wrote the result, saw finite losses
    assert a["status"] == b["status"] == "ok" and len(a["step_s_windows"]) == len(b["step_s_windows"]) >= 2


@pytest.mark.parametrize(("exc", "kind"), [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "oom"),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), "oom"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "oom"),
    (RuntimeError("cudaErrorMemoryAllocation"), "oom"),
    # One kernel choice past the shared memory of an SM: a compile-time limit, not memory.
    (RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448"), "exception"),
    (ValueError("boom"), "exception"),
])
def test_gpu_out_of_memory_forms_are_classified_oom(exc: BaseException, kind: str) -> None:
    assert classify(exc)["failure"] == kind


def test_peak_flops_of_nvl_and_grace_hopper_parts() -> None:
    assert peak_flops("NVIDIA H100 NVL") == 835e12 and peak_flops("NVIDIA H200 NVL") == 835e12
    assert peak_flops("NVIDIA GH200 480GB") == 989e12 and peak_flops("NVIDIA GH200 144G HBM3e") == 989e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("NVIDIA H20") == 148e12


def test_threads_come_from_the_cores_this_process_may_use() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to pin to one")
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from autocompile.config.spec import Workload; print(Workload().resolved_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "1"  # os.cpu_count() would say every core of the machine


def test_the_matmul_precision_reaches_the_trial(settings_for: Any, tmp_path: Path) -> None:
    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu", "workload.float32_matmul_precision=medium")
    spec = settings.trial_spec(_eager(settings))
    spec.write(tmp_path)
    assert TrialSpec.read(tmp_path).workload.float32_matmul_precision == "medium"
    assert settings.measured_on()["workload"]["float32_matmul_precision"] == "medium"  # part of the study identity
    assert Workload().float32_matmul_precision == "high"
    with pytest.raises(ValueError, match="float32_matmul_precision"):
        Workload(float32_matmul_precision="tf32")


def _eager(settings: Any) -> Any:
    from autocompile.config.knobs import TrialConfig

    return TrialConfig.from_flat({"compile.scope": "none"}, settings.env)


def test_best_config_sets_the_matmul_precision_the_study_ran(settings_for: Any) -> None:
    composed = settings_for("+model=gpt2-tiny", "workload.device=cpu", "workload.float32_matmul_precision=high")
    settings = dataclasses.replace(composed, device="cuda")
    text = snippet(settings, best_entry(settings, {"compile.scope": "module"}), SearchSpace(settings.env, {}, False))
    compile(text, "best_config.py", "exec")
    assert "FLOAT32_MATMUL_PRECISION = 'high'" in text
    assert "torch.set_float32_matmul_precision(FLOAT32_MATMUL_PRECISION)" in text
    assert text.index("set_float32_matmul_precision") < text.index("return apply(")  # before the step is built


def test_framework_exports_say_the_matmul_precision() -> None:
    gpu = dataclasses.replace(make_winner({"compile.scope": "module"}), device="cuda")
    tf32 = dataclasses.replace(gpu, workload={**gpu.workload, "float32_matmul_precision": "high"})
    assert trainer_arguments(tf32)["tf32"] is True
    assert trainer_arguments(gpu)["tf32"] is False  # a study from before the field ran at torch's "highest"
    assert "set_float32_matmul_precision('high')" in accelerate_yaml(tf32)
    assert "set_float32_matmul_precision('high')" in torchtitan_toml(tf32)
    assert "tf32" not in trainer_arguments(make_winner({"compile.scope": "module"}))  # CPU: no TF32 key
