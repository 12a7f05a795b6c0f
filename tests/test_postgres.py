"""Tuners in two processes sharing a PostgreSQL study: one is killed -9, its trial is failed by the
heartbeat and measured again by the other; nothing is lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autocompile.study.records.optuna_store import counted, measured_trials
from autocompile.trial.launcher import free_port
from tests.conftest import skip_missing_service
from tests.test_tuner import ROOT, TINY

BINDIR = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
pytestmark = pytest.mark.integration


@pytest.fixture
def postgres() -> Iterator[str]:
    if not BINDIR or shutil.which("runuser") is None:
        skip_missing_service("PostgreSQL (initdb) or runuser is not installed (scripts/setup.sh installs them "
                             "as root)")
    bindir = BINDIR[-1]
    data = Path(tempfile.mkdtemp(prefix="autocompile-pg-"))
    user = [] if os.getuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if os.getuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run([*user, str(bindir / "initdb"), "-D", str(data / "db"), "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True)
    port = free_port()
    subprocess.run([*user, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-w", "-l", str(data / "log"), "-o",
                    f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*user, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_killed_tuner_trial_is_failed_by_heartbeat_and_measured_again(tmp_path: Path, postgres: str) -> None:
    args = [sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", f"study.storage={postgres}",
            "study.heartbeat_s=1", "+model.block_sleep_s=0.02", "compile.scope=none", "amp.dtype=none",
            "study.prune=false", "measure.windows=40", "study.n_trials=4"]
    # The survivor starts once a victim's trial has claimed its program: started together, the survivor's trials
    # could claim every program first (a configuration of no compile is one program), leaving the victim only
    # trials that wait for them, as CI once saw beside another test.
    victim = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    survivor = None
    storage = optuna.storages.RDBStorage(postgres)
    killed = None
    deadline = time.time() + 480  # beside another integration test, 240 s once passed before the victim timed a window
    while killed is None and time.time() < deadline and victim.poll() is None:
        time.sleep(0.3)
        studies = optuna.get_all_study_summaries(storage)
        if not studies:
            continue
        study = optuna.load_study(study_name=studies[0].study_name, storage=storage)
        for t in study.get_trials(states=(TrialState.RUNNING,)):
            if t.user_attrs.get("owner", {}).get("pid") != victim.pid:
                continue
            if survivor is None and "program" in t.user_attrs:
                survivor = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            text=True)
            progress = Path(t.user_attrs.get("trial_dir", "/nonexistent")) / "progress.jsonl"
            if progress.exists() and '"window"' in progress.read_text():
                os.kill(victim.pid, signal.SIGKILL)
                killed = t.number
                break
    if killed is None:
        victim.kill()
        if survivor is not None:
            survivor.kill()
    assert killed is not None, f"the victim tuner never timed a window (exit code {victim.returncode})"
    victim.wait()
    assert survivor is not None
    _, err = survivor.communicate(timeout=600)
    assert survivor.returncode == 0, err[-3000:]

    trials = study.get_trials()
    dead = trials[killed]
    assert dead.state == TrialState.FAIL and dead.user_attrs["interrupted"]
    assert "heartbeat" in dead.user_attrs["reason"]  # not its pid: the database path works across hosts
    (retry,) = [t for t in trials if t.user_attrs.get("retry_of") == killed]
    assert retry.user_attrs["identity"] == dead.user_attrs["identity"]
    assert retry.user_attrs["owner"]["pid"] == survivor.pid and retry.state == TrialState.COMPLETE
    assert sum(counted(t) for t in trials) == 4
    identities = [t.user_attrs["identity"] for t in measured_trials(study)
                  if t.user_attrs.get("remeasure_of") is None]  # a near-miss prune measured once more is meant
    assert len(identities) == len(set(identities))
    assert not [t for t in trials if t.state == TrialState.RUNNING]
