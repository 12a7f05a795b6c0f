"""A script study's winner, applied: ``best_config.py`` runs the user's unchanged script with the winner's compile
(the agent's take-over, as in the trial), and ``best_config.yaml`` says how, for prepare() too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autocompile.report.export.script_snippet import PREPARE, RUN, run_commands, run_entries
from autocompile.report.export.snippet import snippet
from autocompile.report.findings.entry import Entry
from autocompile.study.records.record import Measurement
from tests.conftest import ROOT
from tests.test_script_cli import settings

TINY = """
import sys
import torch
import autocompile
from torch._dynamo.utils import counters

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if "--prepare" in sys.argv:
    model, opt = autocompile.prepare(model, opt)
elif "--plain" not in sys.argv:  # --plain: no torch.compile anywhere
    model = torch.compile(model)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("RESULT", type(model).__name__, "forward" in model.__dict__, counters["frames"]["ok"] > 0)
"""
WINNER = {"compile.scope": "module", "compile.backend": "eager"}


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, Path]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.py").write_text(TINY)
    run_dir = tmp_path / "outputs" / "tiny-study"
    run_dir.mkdir(parents=True)
    return settings("script.path=tiny.py", "script.args='--steps=3'"), run_dir


def write_winner(s: object, run_dir: Path) -> None:
    measured = Measurement(status="ok", tokens_per_s=100.0, throughput_unit="samples", step_s=0.01, compile_s=1.0)
    best = Entry(5, "module", dict(WINNER), None, measured, 2.0, None)
    (run_dir / "best_config.py").write_text(snippet(s, best, None, "python -m autocompile task=measure", run_dir))
    entries = run_entries(run_commands(s, run_dir))  # what write_artifacts adds to best_config.yaml
    (run_dir / "best_config.yaml").write_text(yaml.safe_dump({"knobs": WINNER, **entries}))


def python(*args: str, cwd: Path, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "AUTOCOMPILE_BEST_CONFIG"}
    environ.update(PYTHONPATH=str(ROOT), **env)
    out = subprocess.run([sys.executable, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))


def test_best_config_py_runs_the_unchanged_script_with_the_winner_applied_as_its_trial_did(study) -> None:
    s, run_dir = study
    write_winner(s, run_dir)
    # The agent's take-over: the module compiled in place (the trial's program), not torch's OptimizedModule.
    assert python(str(run_dir / "best_config.py"), cwd=run_dir.parent) == "RESULT Sequential True True"
    # Without best_config.py and no winner named: prepare() leaves the model as it was (eager, nothing compiled).
    assert python("tiny.py", "--prepare", cwd=run_dir.parent.parent) == "RESULT Sequential False False"
    # A script with no torch.compile: the module owning the optimizer's parameters compiled at its first step.
    assert python(str(run_dir / "best_config.py"), "--plain", cwd=run_dir.parent) == "RESULT Sequential True True"


def test_the_winner_reaches_prepare_through_best_config_py_and_through_the_environment(study) -> None:
    s, run_dir = study
    write_winner(s, run_dir)
    doc = yaml.safe_load((run_dir / "best_config.yaml").read_text())
    assert doc["run"] == f"python {run_dir.resolve() / 'best_config.py'}"
    assert doc["run_with_prepare"] == (f"AUTOCOMPILE_BEST_CONFIG={run_dir.resolve() / 'best_config.yaml'} "
                                       "python tiny.py --steps=3")
    here = run_dir.parent.parent
    assert python(str(run_dir / "best_config.py"), "--prepare", cwd=here) == "RESULT Sequential True True"
    named = python("tiny.py", "--prepare", cwd=here, AUTOCOMPILE_BEST_CONFIG=str(run_dir / "best_config.yaml"))
    assert named == "RESULT Sequential True True"


def test_the_run_commands_launch_as_the_study_did(study) -> None:
    _, run_dir = study
    two = settings("script.path=tiny.py", "workload.nproc_per_node=2")
    assert run_commands(two, run_dir)[RUN] == f"torchrun --nproc-per-node=2 {run_dir.resolve() / 'best_config.py'}"
    assert run_commands(two, run_dir)[PREPARE].endswith("torchrun --nproc-per-node=2 tiny.py")
    assert run_commands(settings("+model=gpt2-tiny"), run_dir) == {}  # autocompile's loop: best_config.py applies it
