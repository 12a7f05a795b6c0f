"""scripts/gpu_check.py without a GPU: its plan fits the device's limits and lists every check with a budget
(``--dry-run``, no torch imported), its configurations are valid where they will run, a stage past its time is
stopped, and its report says why a configuration has no numbers and which check each CUDA test proves."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import Workload
from autocompile.trial.timing.readings import peak_flops
from tests.loading import load_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_file(ROOT / "scripts" / "gpu_check.py")


def test_every_configuration_is_valid_on_cuda_and_the_rest_on_cpu(gpu_check: ModuleType) -> None:
    cuda, cpu = Env.detect("cuda", 1, False), Env.detect("cpu", 1, False)
    names = [c.name for c in gpu_check.CONFIGS]
    assert len(set(names)) == len(names)
    stage_of = {c.name: s.name for s in gpu_check.STAGES for c in s.configs}
    for i, c in enumerate(gpu_check.CONFIGS):
        config = TrialConfig.from_flat(c.knobs, cuda)  # strict: a misspelled or inapplicable knob raises
        assert config.amp.dtype in ("bfloat16", "float16") or c.workload  # fp32 only in the TF32 pairs
        if not c.cuda_only:
            TrialConfig.from_flat(c.knobs, cpu)
        if c.warm_from:
            assert c.warm_from in names[:i]  # its cache exists by then
            assert stage_of[c.warm_from] == stage_of[c.name]  # and is in the same command's work folder
    modes = {TrialConfig.from_flat(c.knobs, cuda).compile.mode for c in gpu_check.CONFIGS}
    assert {"reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"} <= modes


def test_the_tf32_pairs_differ_only_in_matmul_precision(gpu_check: ModuleType) -> None:
    pairs = [c for c in gpu_check.CONFIGS if c.workload]
    assert {c.workload["float32_matmul_precision"] for c in pairs} == {"highest", "high"}
    for off, on in zip(pairs[::2], pairs[1::2], strict=True):
        assert off.knobs == on.knobs and off.knobs["amp.dtype"] == "none"
    if "float32_matmul_precision" not in {f.name for f in dataclasses.fields(Workload)}:
        pytest.skip("workload.float32_matmul_precision is not in this tree yet (issue 27 finding 15)")
    for c in pairs:
        Workload(**c.workload)  # a value the workload accepts


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
    import gpu_check_report

    ok = {"name": "default", "status": "ok", "cache": "cold", "result": {
        "tokens_per_s": 123456.0, "mfu": 0.41, "compile_s": 48.2, "peak_memory_bytes": 21 * 2**30,
        "step_s": 0.066, "step_s_cv": 0.01, "wall_s": 61.0}}
    timeout = {"name": "max-autotune", "status": "failed", "cache": "cold", "reason": "timeout: exceeded",
               "result": {"wall_s": 150.0}}
    skipped = {"name": "later", "status": "not run", "cache": "-", "reason": "time budget (12 s left)"}
    text = gpu_check_report.table([ok, timeout, skipped])
    assert "| default | ok | 123,456 | 41.0% | 48.2 | 21.00 | 66.0 (1.0%) | 61 | cold |" in text
    assert "- max-autotune: failed: timeout: exceeded" in text and "- later: not run: time budget" in text


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 NVL", 835e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA H20", 148e12), ("NVIDIA GeForce RTX 2080", 0.0),
])
def test_mfu_peak_of_the_project_gpus(name: str, peak: float) -> None:
    assert peak_flops(name) == peak


ISSUE_27_CUDA_FINDINGS = {1, 3, 4, 7, 9, 10}
"""The findings of issue 27 that a CUDA test must check on a GPU."""


def test_dry_run_lists_every_stage_and_check_with_budgets_inside_the_device_limits(gpu_check: ModuleType) -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import runpy, sys\nsys.argv = ['gpu_check.py', '--dry-run']\ntry:\n"
         "    runpy.run_path('scripts/gpu_check.py', run_name='__main__')\nexcept SystemExit as e:\n"
         "    print('EXIT', e.code, 'torch' in sys.modules)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = run.stdout
    assert run.returncode == 0 and "EXIT 0 False" in out, run.stderr + out  # it ran and imported no torch
    commands = [(c, float(b)) for c, b in re.findall(r"^command \d+: (bash scripts/gpu_check\.sh --stage \S+)"
                                                     r"\s+\[budget (\d+) s", out, re.M)]
    assert len(commands) <= 3 and all(b <= 9 * 60 for _, b in commands)
    assert sum(b for _, b in commands) <= 25 * 60
    stages = dict(re.findall(r"^  stage (\S+)\s+(\d+) s  \S", out, re.M))
    installs = re.findall(r"^  install\s+(\d+) s", out, re.M)
    assert set(stages) == {s.name for s in gpu_check.STAGES} and len(installs) == len(commands)
    for command, budget in commands:  # each command's budget is its install and its stages, each run once
        names = command.rsplit(" ", 1)[1].split(",")
        assert budget == float(installs[0]) + sum(float(stages[n]) for n in names)
    assert sorted(n for c, _ in commands for n in c.rsplit(" ", 1)[1].split(",")) == sorted(stages)
    findings = {int(f) for f in re.findall(r"^    check +\d+ s  \S.*\(issue 27 finding (\d+)\)", out, re.M)}
    assert findings >= ISSUE_27_CUDA_FINDINGS
    for c in gpu_check.CONFIGS:
        assert re.search(rf"^    config +\d+ s  {re.escape(c.name)}: .*\(cap \d+ s", out, re.M), c.name
    assert "PLAN PROBLEM" not in out


def test_the_plan_check_catches_a_command_over_its_limit(
        gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_check_plan as plan

    assert plan.check_plan() == []
    monkeypatch.setattr(plan, "COMMANDS", (("tests", "tf32", "table"), ("autotune", "study")))
    assert any("> 540 s" in p for p in plan.check_plan())
    monkeypatch.setattr(plan, "COMMANDS", (("tests", "tf32"), ("autotune", "study")))
    assert any("exactly one command" in p for p in plan.check_plan())


def test_each_check_reports_its_own_tests_outcomes(gpu_check: ModuleType, tmp_path: Path) -> None:
    import gpu_check_report

    # Written as pytest --junitxml writes it; a test parametrized twice, one of them failed.
    (tmp_path / "pytest.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cuda" name="test_cuda_graph_modes_in_every_scope_match_eager[module-a]"/>'
        '<testcase classname="tests.test_cuda" name="test_cuda_graph_modes_in_every_scope_match_eager[module-b]">'
        '<failure message="boom">trace</failure></testcase>'
        '<testcase classname="tests.test_cuda" name="test_hopper_gpus_get_their_bf16_peak">'
        '<skipped message="needs a CUDA GPU"/></testcase></testsuite></testsuites>')
    outcomes = gpu_check_report.junit_outcomes(tmp_path / "pytest.xml")
    assert outcomes["test_cuda_graph_modes_in_every_scope_match_eager[module-b]"] == "failed"
    checks = {c["what"].split(":")[0]: c for c in gpu_check_report.check_results(ROOT, outcomes)}
    graphs = checks["CUDA-graph modes (reduce-overhead, max-autotune) in module/regional/train_step scope"]
    assert graphs["result"] == "1 passed, 1 failed"
    assert checks["the worker on a GPU"]["result"] == "1 skipped"  # the worker test itself did not run
    assert checks["activation checkpointing under CUDA graphs (module, regional)"]["result"] == "not run"
    assert len(checks) == len(gpu_check.STAGES[0].checks)


def test_merge_puts_three_commands_into_one_report(gpu_check: ModuleType, tmp_path: Path) -> None:
    import gpu_check_report

    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "date": "d", "python": "3.12", "cpus": 16}
    args = {"model": "gpt2", "batch_size": 8, "seq_len": 1024, "windows": 3, "window_steps": 5}

    def row(name: str) -> dict:
        return {"name": name, "knobs": {}, "note": "", "cache": "cold", "status": "not run", "reason": "time"}

    parts = {"tests-tf32": (["tests", "tf32"], [row("default-fp32-tf32")], None),
             "table": (["table"], [row("regional"), row("eager")], None),
             "autotune-study": (["autotune", "study"], [row("max-autotune")], {"status": "failed", "reason": "x"})}
    for name, (stages, rows, study) in parts.items():
        (tmp_path / f"gpu_check-{name}.json").write_text(json.dumps({
            "environment": {**env, "command": f"bash scripts/gpu_check.sh --stage {','.join(stages)}"},
            "args": {**args, "stage": stages}, "tests": None, "bench": rows, "study": study, "wall_s": 100.0}))
    text = gpu_check_report.merge(tmp_path)
    assert (tmp_path / "gpu_check.md").read_text() == text
    commands = next(ln for ln in text.splitlines() if ln.startswith("Commands: "))
    assert commands.count("bash scripts/gpu_check.sh --stage") == 3 and "check 300 s" in text
    names = [ln.split(" | ")[0].strip("| ") for ln in text.splitlines() if ln.startswith("| ") and "not run" in ln]
    assert names == ["eager", "regional", "default-fp32-tf32", "max-autotune"]  # in the plan's order
    assert "failed: x" in text
    assert "--stage table,tf32,autotune --only eager,regional,default-fp32-tf32,max-autotune --name rest" in text
