"""The private Optuna names the study relies on (Optuna has no public API for them) are where it expects them:
this fails on an Optuna release that moves one, before a study would (pyproject.toml bounds optuna too)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autocompile.study.records.optuna_store import beats, heartbeat, stale_trial_ids, storage_of, trial_id

PRIVATE = {
    "optuna.Study": ("_storage", "_study_id"),
    "optuna.Trial": ("_trial_id",),
    "optuna.trial.FrozenTrial": ("_trial_id",),
    "a database storage (cached)": ("_get_stale_trial_ids",),
}


pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")


def rdb(path: Path, interval: int = 1) -> RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RDBStorage(f"sqlite:///{path}", heartbeat_interval=interval, grace_period=interval)


def test_every_private_name_exists(tmp_path: Path) -> None:
    study = optuna.create_study(storage=rdb(tmp_path / "s.db"))
    trial = study.ask()
    frozen = study.get_trials(deepcopy=False)[0]
    holders = {"optuna.Study": study, "optuna.Trial": trial, "optuna.trial.FrozenTrial": frozen,
               "a database storage (cached)": study._storage}
    missing = [f"{what}.{name}" for what, names in PRIVATE.items() for name in names
               if not hasattr(holders[what], name)]
    assert not missing, f"Optuna {optuna.__version__} moved {missing}: update autocompile/study/records/optuna_store.py"
    assert trial_id(trial) == trial_id(frozen)
    assert storage_of(study).get_trial(trial_id(frozen)).number == frozen.number


def test_heartbeats_and_stale_trials_through_them(tmp_path: Path) -> None:
    journal = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(tmp_path / "j.journal"))))
    assert not beats(storage_of(journal))  # a journal file: pids, not heartbeats

    study = optuna.create_study(storage=rdb(tmp_path / "s.db"))
    assert beats(storage_of(study))
    trial = study.ask()
    heartbeat(study, trial)()
    assert stale_trial_ids(study) == set()  # it just beat
    time.sleep(2.2)  # past the interval and the grace period (1 s each) without a beat: Optuna's own clock
    assert stale_trial_ids(study) == {trial_id(trial)}


def test_pyproject_bounds_optuna_to_the_major_checked_here() -> None:
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    bound = int(text.split('"optuna>=4.5,<', 1)[1].split('"', 1)[0])
    assert int(optuna.__version__.split(".")[0]) < bound
