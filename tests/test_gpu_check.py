"""scripts/gpu_check.py without a GPU: its configurations are valid where they will run, a stage past its
time is stopped, and its table says why a configuration has no numbers."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from autocompile.config.knobs import Env, TrialConfig
from autocompile.trial.worker import peak_flops

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_every_configuration_is_valid_on_cuda_and_the_rest_on_cpu(gpu_check: ModuleType) -> None:
    cuda, cpu = Env.detect("cuda", 1, False), Env.detect("cpu", 1, False)
    names = [c.name for c in gpu_check.CONFIGS]
    assert len(set(names)) == len(names)
    for i, c in enumerate(gpu_check.CONFIGS):
        config = TrialConfig.from_flat(c.knobs, cuda)  # strict: a misspelled or inapplicable knob raises
        assert config.amp.dtype in ("bfloat16", "float16")
        if not c.cuda_only:
            TrialConfig.from_flat(c.knobs, cpu)
        if c.warm_from:
            assert c.warm_from in names[:i]  # its cache exists by then
    modes = {TrialConfig.from_flat(c.knobs, cuda).compile.mode for c in gpu_check.CONFIGS}
    assert {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"} <= modes


def test_a_stage_past_its_time_is_stopped_with_its_whole_session(gpu_check: ModuleType, tmp_path: Path) -> None:
    started = time.time()
    code, output = gpu_check.run_bounded(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
         "print('up', child.pid, flush=True); time.sleep(600)"], 2, tmp_path / "log")
    assert code == 124 and "up" in output and "time budget" in output
    assert time.time() - started < 2 + gpu_check.KILL_GRACE_S
    child = int(output.split("up ")[1].split()[0])
    with contextlib.suppress(psutil.NoSuchProcess):  # the stage's own child went with it
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_the_table_shows_numbers_and_why_others_have_none(gpu_check: ModuleType) -> None:
    ok = {"name": "default", "status": "ok", "cache": "cold", "result": {
        "tokens_per_s": 123456.0, "mfu": 0.41, "compile_s": 48.2, "peak_memory_bytes": 21 * 2**30,
        "step_s": 0.066, "step_s_cv": 0.01, "wall_s": 61.0}}
    timeout = {"name": "max-autotune", "status": "failed", "cache": "cold", "reason": "timeout: exceeded",
               "result": {"wall_s": 150.0}}
    skipped = {"name": "later", "status": "not run", "cache": "-", "reason": "time budget (12 s left)"}
    text = gpu_check.table([ok, timeout, skipped])
    assert "| default | ok | 123,456 | 41.0% | 48.2 | 21.00 | 66.0 (1.0%) | 61 | cold |" in text
    assert "- max-autotune: failed: timeout: exceeded" in text and "- later: not run: time budget" in text


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 NVL", 835e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA H20", 148e12), ("NVIDIA GeForce RTX 2080", 0.0),
])
def test_mfu_peak_of_the_project_gpus(name: str, peak: float) -> None:
    assert peak_flops(name) == peak
