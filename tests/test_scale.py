"""Scaling out: tuners sharing a study, parallel slots, multi-node trials, the SLURM launcher config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autocompile.study.phases.plans import key_of
from autocompile.study.records.optuna_store import counted, measured_trials
from tests.test_tuner import ROOT, TINY, load, tune_cli

SMALL = ["compile.backend=eager", "amp.dtype=none", "ac.policy=none", "study.prune=false"]


@pytest.mark.integration
def test_two_tuner_processes_share_one_study_without_measuring_anything_twice(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", *SMALL, "study.n_trials=8"]
    tuners = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    for tuner in tuners:
        _, err = tuner.communicate(timeout=600)
        assert tuner.returncode == 0, err[-3000:]
    study = load(tmp_path)
    owners = {t.user_attrs["owner"]["pid"] for t in study.trials}
    assert len(owners) == 2  # both tuners worked on the study
    identities = [t.user_attrs["identity"] for t in measured_trials(study)
                  if t.user_attrs.get("remeasure_of") is None]  # a near-miss prune measured once more is meant
    assert len(identities) == len(set(identities))
    baselines = [t.user_attrs["baseline"] for t in measured_trials(study) if "baseline" in t.user_attrs]
    assert sorted(baselines) == ["compile", "eager", "regional"]
    assert 8 <= sum(counted(t) for t in study.trials) <= 9  # cooperating tuners stop together
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


@pytest.mark.integration
@pytest.mark.parametrize("n", [2, 3])
def test_tuners_started_at_once_on_a_fresh_root_share_the_default_stores(tmp_path: Path, n: int) -> None:
    # The same command in n shells: the MLflow store (sqlite:///<output_root>/mlflow.db), the study
    # and its parent run are all created by whichever comes first, at the same instant.
    from mlflow.tracking import MlflowClient

    from autocompile.report.tracking.runs import PARENT_ATTR, STUDY_TAG

    args = [sys.executable, "-m", "autocompile", "+model=gpt2-tiny", "compile.backend=aot_eager", "study.n_trials=4",
            "workload.batch_size=2", "workload.seq_len=[16]", "workload.device=cpu", "measure.windows=2",
            "measure.window_steps=2", "measure.warmup_steps=2", f"output_root={tmp_path}",
            # Phases kept short but on: the tuners must run them one at a time, never twice. Three processes a
            # phase: the staged plan's first four trials are compiled (issue 35), and 7 processes of compiled
            # candidates in both phases took this test past its 900 s under CI's load.
            "study.confirm_top=1", "study.repeats=2", "study.verdicts=[amp.dtype]", "compare.processes=3"]
    tuners = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for _ in range(n)]
    for tuner in tuners:
        _, err = tuner.communicate(timeout=900)
        assert tuner.returncode == 0, err[-3000:]
    study = load(tmp_path)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    identities = [t.user_attrs["identity"] for t in measured_trials(study)
                  if t.user_attrs.get("remeasure_of") is None]  # a near-miss prune measured once more is meant
    assert len(identities) == len(set(identities))  # no configuration measured twice
    assert 4 <= sum(counted(t) for t in trials if t.user_attrs.get("remeasure_of") is None) <= 4 + n - 1
    repeats = [key_of(t) for t in trials if key_of(t) and t.state.is_finished()]
    assert repeats and len(repeats) == len(set(repeats))  # each repeat measured once, by one tuner

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`{STUDY_TAG}` = '{study.study_name}'")
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.run_id == study.user_attrs[PARENT_ATTR] and parent.info.status == "FINISHED"
    children = [r for r in runs if r.info.run_id != parent.info.run_id]  # at any depth: repeats nest
    logged = sorted(int(r.data.tags["optuna.trial_number"]) for r in children)
    assert logged == [t.number for t in trials if t.state.is_finished()]  # each trial once
    direct = {r.info.run_id for r in children if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert len(direct) == len({t.user_attrs.get("identity", t.number) for t in trials if t.state.is_finished()})
    assert all(r.data.tags.get("mlflow.parentRunId") in {parent.info.run_id, *direct} for r in children)  # no other


@pytest.mark.integration
def test_two_slots_run_trials_side_by_side_each_on_its_own_core(tmp_path: Path) -> None:
    # The tuner runs pinned to two of this machine's cores (whatever it has), so the slots it makes are known.
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("two slots need two cores")
    pinned = mine[-2:]
    run = subprocess.run([sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}",
                          "compile.backend=eager", "launch.slots=2", "study.baselines=false", "study.n_trials=4",
                          "study.prune=false"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         preexec_fn=lambda: os.sched_setaffinity(0, pinned))
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in tmp_path.glob("*/trials/*/result.json")]
    assert len(results) >= 3 and any(r["status"] == "ok" for r in results)
    seen = {tuple(r["environment"]["cpus"]) for r in results}
    assert seen == {(pinned[0],), (pinned[1],)}  # each trial saw only its slot's core; both slots were used
    assert all(r["resources"]["cpus"] == r["environment"]["cpus"] for r in results)
    assert all(r["environment"]["threads"] == 1 for r in results)


@pytest.mark.integration
def test_a_two_node_trial_from_two_torchrun_agents(tmp_path: Path) -> None:
    run = tune_cli(tmp_path, *SMALL, "compile.scope=module", "workload.nnodes=2", "study.baselines=false",
                   "study.n_trials=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (trial_dir,) = tmp_path.glob("*/trials/0000")
    result = json.loads((trial_dir / "result.json").read_text())
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2
    assert len(result["param_checksums"]) == 2 and len(set(result["param_checksums"])) == 1
    assert (trial_dir / "stderr.node1.log").exists()  # the second node's agent
    assert "--nnodes=2" in (trial_dir / "cmd.txt").read_text()
    assert load(tmp_path).trials[0].user_attrs["result"]["environment"]["world_size"] == 2


def test_slurm_launcher_config_composes_for_a_job_array() -> None:
    from hydra import compose, initialize_config_dir

    from autocompile.app import CONF_DIR, check_command_line
    from autocompile.config.settings import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "+model=gpt2-tiny", "launch.worker=3"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.array_parallelism == 64
    assert cfg.launch.worker == 3
    # The documented command line validates: eight tuner jobs on one study.
    check_command_line(["-m", "hydra/launcher=slurm", "+model=gpt2-tiny", "launch.worker=range(8)",
                        "tracking.enabled=false"])
