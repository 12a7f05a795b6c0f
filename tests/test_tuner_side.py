"""The tuner on a GPU machine, checked on a CPU: it never makes a CUDA context of its own, it checks Triton
against torch's pin, max-autotune trials get a longer timeout, torchrun leaves nothing in the temporary
directory, and the trials' inductor caches are pruned."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from autocompile.config.gpus import triton_pin, triton_problem
from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import Workload
from autocompile.study.records.objective import Objective
from autocompile.study.records.record import Measurement, set_attrs
from autocompile.trial.timing.compile_artifacts import TRIAL_FILE
from tests.conftest import ROOT, assert_ok, launched, make_spec, tiny_lm

TINY = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
        "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "tracking.enabled=false"]

CUDA_INITIALISING = re.compile(r"get_device_name\(|get_device_properties\(|get_device_capability\(|mem_get_info\("
                               r"|cuda\.set_device\(|cuda\.current_device\(|cuda\.synchronize\(|cuda\.init\(")
WORKER_SIDE = ("trial/program", "trial/timing", "trial/script")
"""autocompile/ folders whose modules run only in the trial processes (the user's script's too), which own their GPU."""


def test_the_tuner_side_paths_on_cuda_never_initialise_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every CUDA initialisation in torch goes through torch.cuda._lazy_init (tensor creation on a CUDA
    # device included: the C++ side calls it), so none may happen while the tuner reads its GPUs.
    from autocompile.config.gpus import device_name
    from autocompile.report.tracking.runs import local_environment
    from autocompile.study.phases.sidebyside import _free_memory
    from autocompile.workload.parts import knob_facts

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the tuner initialised CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", refused)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    adamw = Workload(optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.0123})
    # The probe ran on a CUDA tensor: on a GPU a context on GPU 0 for the whole study (here: fused not offered).
    assert knob_facts(adamw, "cuda")["optimizer_impls"] == ("for_loop", "fused")
    assert device_name("cuda")  # nvidia-smi, else a child process: here neither can say, and nothing raised
    assert local_environment("cuda")["device_name"]
    assert _free_memory("cuda", "0") is None  # nothing could read it: no memory check rather than a context


def test_no_cuda_initialising_call_in_tuner_side_code() -> None:
    tuner_side = [p for p in (ROOT / "autocompile").rglob("*.py")
                  if p.parent.relative_to(ROOT / "autocompile").as_posix() not in WORKER_SIDE]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in tuner_side for n, line in enumerate(p.read_text().splitlines(), 1)
             if CUDA_INITIALISING.search(line) and "snippet" not in p.name and not line.lstrip().startswith("#")
             and "``" not in line and "_child(" not in line]  # a child process's context ends with it
    assert found == []


def test_triton_is_checked_against_the_version_torch_pins() -> None:
    linux = 'triton==3.6.0; platform_system == "Linux"'
    requires = ["filelock", "sympy>=1.13.3", linux, 'optree>=0.13.0; extra == "optree"']
    import platform

    pin = triton_pin(requires)
    assert pin == (("triton", "3.6.0") if platform.system() == "Linux" else None)
    assert triton_pin(["filelock", 'triton==9.9; extra == "gpu"']) is None  # a CPU wheel: no pin
    assert triton_pin(["pytorch-triton==3.6.0+git5261b273"]) == ("pytorch-triton", "3.6.0+git5261b273")
    pin = ("triton", "3.6.0")
    assert triton_problem(pin, {"triton": "3.6.0"}, None, "2.11.0+cu128") is None
    wrong = triton_problem(pin, {"triton": "3.7.1"}, None, "2.11.0+cu128")
    assert wrong is not None and "needs triton==3.6.0 but 3.7.1 is installed" in wrong
    assert wrong.endswith("pip install 'triton==3.6.0'") and "\n" not in wrong
    missing = triton_problem(pin, {}, "ModuleNotFoundError: No module named 'triton'", "2.11.0")
    assert missing is not None and "not installed" in missing and "pip install 'triton==3.6.0'" in missing
    other = triton_problem(("pytorch-triton", "3.6.0+git1"), {"triton": "3.6.0"}, None, "2.12.0.dev")
    assert other is not None and "pip uninstall -y triton" in other
    broken = triton_problem(pin, {"triton": "3.6.0"}, "ImportError: libcuda.so.1", "2.11.0")
    assert broken is not None and "does not import" in broken
    assert triton_problem(None, {}, None, "2.13.0+cpu") is None


def test_the_gpu_extra_no_longer_installs_an_unpinned_triton() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(r.replace(" ", "").startswith("triton") for group in extras.values() for r in group)


def test_autotuning_trials_get_a_longer_timeout(settings_for: Any) -> None:
    from autocompile.config.settings import AUTOTUNE_TIMEOUT_FACTOR

    settings = settings_for(*TINY, "measure.timeout_s=100")
    env = Env.detect("cpu", 1, False)  # max-autotune-no-cudagraphs is a CPU mode too
    plain = TrialConfig.from_flat({"compile.scope": "module"}, env)
    tuned = TrialConfig.from_flat({"compile.scope": "module", "compile.mode": "max-autotune-no-cudagraphs"}, env)
    eager = TrialConfig.from_flat({"compile.scope": "none"}, env)
    assert settings.trial_spec(plain).measure.timeout_s == 100
    assert settings.trial_spec(eager).measure.timeout_s == 100
    assert settings.trial_spec(tuned).measure.timeout_s == 100 * AUTOTUNE_TIMEOUT_FACTOR > 100
    assert settings.patience_s > 100 * AUTOTUNE_TIMEOUT_FACTOR  # waiting on another tuner's trial outlasts it


@pytest.mark.integration  # torchrun at world size 1 is the non-default launcher (5 s); the default one is below
def test_a_trial_leaves_no_torchelastic_directory_in_the_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # torchrun's tempfile.mkdtemp(prefix="torchelastic_") lands here
    spec = make_spec({"compile.scope": "none"}, model=tiny_lm())
    spec.measure = replace(spec.measure, launcher="torchrun")  # a one-process trial runs plain python otherwise
    result = launched(tmp_path / "trial", spec)
    assert_ok(result)
    assert list(tmp.glob("torchelastic_*")) == []
    assert (tmp_path / "trial" / "torchrun").is_dir()  # torchrun's per-rank logs stay with the trial


def test_a_one_process_trial_runs_its_worker_with_plain_python_and_no_torchrun_agent(tmp_path: Path) -> None:
    """World size 1 needs no rendezvous: the worker is the process the launcher starts (no torchrun agent importing
    torch beside it and polling while it is timed), and cmd.txt says so."""
    result = launched(tmp_path / "trial", make_spec({"compile.scope": "none"}, model=tiny_lm()))
    assert_ok(result)
    assert not (tmp_path / "trial" / "torchrun").exists()
    command = (tmp_path / "trial" / "cmd.txt").read_text().splitlines()[0]
    assert "torch.distributed.run" not in command and "-m autocompile.trial.timing.worker" in command


def _trial_with_cache(study: optuna.Study, run_dir: Path, state: str) -> optuna.trial.FrozenTrial:
    trial = study.ask()
    trial_dir = run_dir / "trials" / f"{trial.number:04d}"
    (trial_dir / "inductor_cache" / "fxgraph").mkdir(parents=True)
    (trial_dir / "inductor_cache" / "fxgraph" / "entry").write_bytes(b"x" * 1000)
    (trial_dir / TRIAL_FILE).write_bytes(b"artifacts")
    set_attrs(trial, trial_dir=str(trial_dir))
    if state != "running":
        study.tell(trial, 1.0 if state == "complete" else None,
                   state=optuna.trial.TrialState.COMPLETE if state == "complete" else optuna.trial.TrialState.FAIL)
    return study.trials[trial.number]


def test_caches_are_pruned_when_the_study_ends_but_the_winners_and_running_trials(tmp_path: Path) -> None:
    from autocompile.study.search.warmstart import prune_caches

    study = optuna.create_study()
    winner, other, failed, running = (_trial_with_cache(study, tmp_path, s)
                                      for s in ("complete", "complete", "failed", "running"))
    (tmp_path / "warm_start" / "inductor_cache").mkdir(parents=True)
    assert prune_caches(study, winner, tmp_path) == 2000
    dirs = {t.number: Path(t.user_attrs["trial_dir"]) for t in (winner, other, failed, running)}
    kept = {n for n, d in dirs.items() if (d / "inductor_cache").exists()}
    assert kept == {winner.number, running.number}
    assert not (tmp_path / "warm_start" / "inductor_cache").exists()
    assert all((d / TRIAL_FILE).is_file() for d in dirs.values())  # what side by side and the warm start load


def test_two_tuners_pruning_the_same_cache_at_once_both_finish(tmp_path: Path) -> None:
    """Two tuners of one study end together and prune the same trials' caches (CI failed on this race)."""
    import threading

    from autocompile.study.search.warmstart import drop_cache

    for attempt in range(10):
        trial_dir = tmp_path / f"{attempt:02d}"
        for i in range(200):
            (trial_dir / "inductor_cache" / f"d{i % 20}").mkdir(parents=True, exist_ok=True)
            (trial_dir / "inductor_cache" / f"d{i % 20}" / f"f{i}").write_bytes(b"x" * 10)
        errors: list[BaseException] = []

        def prune(d: Path = trial_dir, errors: list[BaseException] = errors) -> None:
            try:
                drop_cache(d)
            except BaseException as error:  # noqa: BLE001 - the test reports what a thread raised
                errors.append(error)

        threads = [threading.Thread(target=prune) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and not (trial_dir / "inductor_cache").exists()


def test_a_failed_or_infeasible_trials_cache_goes_when_it_is_told(tmp_path: Path, settings_for: Any) -> None:
    from autocompile.study.search.tell import tell_measured

    settings = settings_for(*TINY, "objective.memory_limit_gb=1")
    objective = Objective(settings.objective)
    study = optuna.create_study()
    trials = []
    for measured in (Measurement(status="failed", failure="oom", reason="out of memory"),
                     Measurement(status="ok", step_s=0.1, tokens_per_s=10.0, compile_s=1.0, losses=[1.0, 0.9],
                                 peak_memory_bytes=2 * 2**30),  # over the 1 GB limit
                     Measurement(status="ok", step_s=0.1, tokens_per_s=10.0, compile_s=1.0, losses=[1.0, 0.9],
                                 peak_memory_bytes=2**20)):
        trial = study.ask()
        trial_dir = tmp_path / f"{trial.number:04d}"
        (trial_dir / "inductor_cache").mkdir(parents=True)
        set_attrs(trial, trial_dir=str(trial_dir))
        study.set_user_attr("reference", {"status": "ok", "losses": [1.0, 0.9]})
        tell_measured(study, trial, objective, measured)
        trials.append(trial_dir)
    assert [(d / "inductor_cache").is_dir() for d in trials] == [False, False, True]
