"""The command line: one-line errors for bad input, and a real measurement."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autocompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


BAD_INPUT = [
    ((), "no model given: add +model=NAME"),
    (("+model=gpt3",), "unknown model 'gpt3': choose one of"),
    (("+model=gpt2-tiny", "compile.scoop=module"), "unknown config key 'compile.scoop'"),
    (("+model=gpt2-tiny", "task=measure", "compile.scope=everything"), "compile.scope='everything' is not valid"),
    (("+model=gpt2-tiny", "workload.batch_size=many"), "workload.batch_size=many"),
    (("+model=custom", "model._target_=no_such_pkg.make", "model.vocab_size=8"),
     "model._target_='no_such_pkg.make' does not import"),
    (("-m", "+model=gpt2-tiny,gpt3"), "unknown model 'gpt3'"),
    (("+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=8", "+model.widht=3"),
     "takes no argument 'widht': drop model.widht"),
    (("+model=custom", "model._target_=tests.models.onehot_lm"),
     "needs vocab_size and the model has no input embedding to read it from: set model.vocab_size=N"),
    (("+model=gpt2-tiny", "workload.optimizer._target_=torch.optim.Adamm"),
     "workload.optimizer._target_='torch.optim.Adamm' does not import"),
    (("+model=gpt2-tiny", "workload.grad_accum_steps=0"), "workload.grad_accum_steps=0 must be >= 1"),
]


# The real command line, a subprocess per case (3-5 s of imports each): the first case in the default run, the rest
# integration (default run: every case in process, test_bad_input_in_process_is_one_line_naming_the_fix).
@pytest.mark.parametrize(("args", "says"), [
    case if i == 0 else pytest.param(*case, marks=pytest.mark.integration) for i, case in enumerate(BAD_INPUT)])
def test_bad_input_is_one_line_naming_the_fix(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    result = cli(*args, f"output_root={tmp_path}")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocompile: error: "), result.stderr
    assert says in lines[0]
    assert not any(tmp_path.iterdir())  # nothing was started


@pytest.mark.parametrize(("args", "says"), BAD_INPUT)
def test_bad_input_in_process_is_one_line_naming_the_fix(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    """The same cases through ``autocompile.app.main`` in this process: the same exit, line and nothing started."""
    code, stderr = cli_in_process(*args, f"output_root={tmp_path}")
    assert code != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocompile: error: "), stderr
    assert says in lines[0]
    assert not any(tmp_path.iterdir())  # nothing was started


def test_measure_one_configuration_prints_the_table(tmp_path: Path) -> None:
    result = cli("+model=gpt2-tiny", "task=measure", "compile.scope=regional", "amp.dtype=bfloat16",
                 "compile.backend=eager", "workload.seq_len=[16]", "workload.batch_size=2",
                 "measure.windows=2", "measure.window_steps=2", "measure.warmup_steps=2", "measure.precision=0",
                 f"output_root={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    for row in ("tokens/s", "compile time", "transformer.h.0, transformer.h.1", "wall time"):
        assert row in result.stdout
    (path,) = tmp_path.glob("*/measure/*/result.json")
    measured = json.loads(path.read_text())
    # Regional is Accelerate's compile_regions: the blocks, then the rest of the model unit by unit.
    assert measured["status"] == "ok" and measured["compiled"] == [
        "transformer.h.0", "transformer.h.1", "transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"]
    assert measured["compiled_coverage"] == 1.0
    assert path.parent.parent.parent.name == "gpt2-tiny-bs2-seq16-ws1-cpu"


def test_each_job_of_a_sweep_over_knobs_or_objectives_is_a_study_of_its_own() -> None:
    from hydra import compose, initialize_config_dir

    from autocompile.config.settings import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        def name(*overrides: str) -> str:
            return compose("config", overrides=["+model=gpt2-tiny", *overrides]).study.name

        base = "gpt2-tiny-bs8-seq128-ws1-cpu"
        assert name() == base
        assert name("compile.mode=max-autotune", "compile.fullgraph=true") == (
            f"{base}+compile.mode=max-autotune+compile.fullgraph=true")
        assert name("objective.kind=throughput") == f"{base}+objective=throughput"
        assert name("objective.horizon_steps=1000") == f"{base}+horizon=1000"
        assert name("task=measure", "compile.mode=max-autotune") == base  # a measurement is not a study
        assert name("study.name=mine", "compile.mode=max-autotune") == "mine"


def test_gpu_slots_take_any_device_ids_and_split_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import os

    from hydra import compose, initialize_config_dir

    from autocompile.app import available_models
    from autocompile.config.settings import register, settings_from
    from autocompile.trial.slots import slots as trial_slots

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["+model=gpt2-tiny", "workload.device=cpu"])
    cpu = settings_from(cfg, available_models())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1d,MIG-7f00,3")  # UUIDs and MIG ids are not integers
    # A fixed machine, not this one: 7 cores in the affinity mask, out of order and with a gap.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {9, 2, 3, 4, 5, 6, 7})
    gpu = dataclasses.replace(cpu, device="cuda")
    slots = trial_slots(gpu)
    assert [s.gpus for s in slots] == [("GPU-5e1d",), ("MIG-7f00",), ("3",)]
    assert [s.cpus for s in slots] == [(2, 3), (4, 5), (6, 7)]  # two cores each, in order; core 9 left over
    cpu2 = trial_slots(dataclasses.replace(cpu, launch=dataclasses.replace(cpu.launch, slots=2)))
    assert [s.cpus for s in cpu2] == [(2, 3, 4), (5, 6, 7)] and all(not s.gpus for s in cpu2)
    one = trial_slots(dataclasses.replace(gpu, launch=dataclasses.replace(gpu.launch, slots=1)))
    assert one[0].gpus == ("GPU-5e1d",) and one[0].cpus == ()  # a lone slot keeps the whole machine


@pytest.mark.parametrize(("field", "value", "says"), [
    ("n_trials", 0, "must be >= 1"), ("confirm_top", -1, "0 = no confirmation phase"),
    ("repeats", 0, "2 or more give intervals"), ("repeat_cache", "hot", "choose warm or cold"),
    ("max_failure_rate", 0.0, "must be in (0, 1]"), ("max_failure_rate", 1.5, "must be in (0, 1]"),
    ("verdicts", ["compile.scoop"], "is no knob with a question"),
])
def test_every_study_setting_is_checked_and_the_error_says_the_fix(field: str, value: Any, says: str) -> None:
    from autocompile.config.settings import StudySettings

    with pytest.raises(ValueError, match=re.escape(says)):
        StudySettings(**{field: value})
