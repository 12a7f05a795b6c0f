"""Ctrl-C stops a study at once and cleanly; the launcher forks safely; a cold trial replays cold."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.spec import ModelSpec
from autocompile.study.records.optuna_store import counted, measured_trials
from autocompile.trial import launcher
from autocompile.trial.launcher import Interrupted, launch, prepare, read_progress
from tests.conftest import make_spec, survivors
from tests.test_tuner import ROOT, TINY, load

SLOW_TINY = ModelSpec(name="tiny-slow", target="tests.models.tiny_lm", vocab_size=64,
                      kwargs={"vocab_size": 64, "block_sleep_s": 0.05})


def in_windows(tmp_path: Path) -> int:
    """Trials of the study that reached their timed windows."""
    return sum('"window"' in p.read_text() for p in tmp_path.glob("*/trials/*/progress.jsonl"))


def in_flight(tmp_path: Path, slots: int) -> bool:
    """One trial in its timed windows and one launched in every slot: the lease times one at a time (the CPU's one
    lease serves every slot), the others wait paused."""
    return in_windows(tmp_path) >= 1 and len(list(tmp_path.glob("*/trials/*"))) >= slots


def test_sigint_stops_the_tuner_even_when_it_started_ignored() -> None:
    """A background job of a script (``cmd &``) starts with SIGINT ignored, and Python then leaves it so:
    the tuner takes it back, or ``kill -INT`` would never stop the study."""
    from autocompile.app import stop_on_signals

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_on_signals()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])



def interrupted_trials(study: optuna.Study, slots: int) -> list[FrozenTrial]:
    """The trials the interrupt cut short: one a slot, failed saying so, none left running; each trial says
    why it measured nothing (its ``result.json``)."""
    assert [t for t in study.trials if t.state == TrialState.RUNNING] == []
    interrupted = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == slots
    assert all(t.state == TrialState.FAIL and t.user_attrs["reason"] == "the tuner was interrupted"
               for t in interrupted)
    for t in interrupted:
        assert json.loads((Path(t.user_attrs["trial_dir"]) / "result.json").read_text())["status"] == "interrupted"
    return interrupted

@pytest.mark.integration
@pytest.mark.parametrize("slots", [2, 1])
def test_ctrl_c_stops_the_study_kills_its_trials_and_leaves_none_running(tmp_path: Path, slots: int) -> None:
    args = [sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", f"launch.slots={slots}",
            "launch.concurrency=1", "+model.block_sleep_s=0.05", "compile.scope=none", "measure.windows=50",
            "study.n_trials=6", "study.prune=false"]
    with open(tmp_path / "tuner.log", "wb") as out:
        # Started as a script's background job is (SIGINT ignored), whatever started this test.
        tuner = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_IGN))
        try:
            deadline = time.time() + 120
            while time.time() < deadline and not in_flight(tmp_path, slots) and tuner.poll() is None:
                time.sleep(0.2)
            assert in_flight(tmp_path, slots), (tmp_path / "tuner.log").read_text()[-3000:]
            tuner.send_signal(signal.SIGINT)
            returncode = tuner.wait(timeout=30)  # stops within 30 s of Ctrl-C, or the test fails here
        finally:
            if tuner.poll() is None:
                tuner.kill()
    log = (tmp_path / "tuner.log").read_text()
    assert returncode == 130, log[-3000:]
    assert "interrupted:" in log and "rerun the same command to resume" in log
    assert survivors(str(tmp_path)) == []  # no torchrun, no worker: nothing measures after the tuner is gone

    study = load(tmp_path)
    interrupted = interrupted_trials(study, slots)
    assert sum(counted(t) for t in study.trials) < 6
    assert sorted(t.user_attrs["retry_of"] for t in study.get_trials(states=(TrialState.WAITING,))) == sorted(
        t.number for t in interrupted)
    (summary,) = tmp_path.glob("*/summary.json")  # the report of what was done is written
    assert json.loads(summary.read_text())["stop_reason"] == "interrupted"


@pytest.mark.integration
@pytest.mark.parametrize("slots", [1, 2])
def test_sigterm_stops_the_study_as_ctrl_c_does_and_a_rerun_resumes_it(tmp_path: Path, slots: int) -> None:
    # What `timeout -s TERM` and SLURM do: SIGTERM to the tuner's whole process group, mid-trial.
    args = [sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", f"launch.slots={slots}",
            "launch.concurrency=1", "+model.block_sleep_s=0.02", "compile.scope=none", "amp.dtype=none",
            "measure.windows=50", "study.n_trials=3", "study.prune=false"]
    with open(tmp_path / "tuner.log", "wb") as out:
        tuner = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and not in_flight(tmp_path, slots) and tuner.poll() is None:
                time.sleep(0.2)
            assert in_flight(tmp_path, slots), (tmp_path / "tuner.log").read_text()[-3000:]
            os.killpg(tuner.pid, signal.SIGTERM)
            returncode = tuner.wait(timeout=60)
        finally:
            if tuner.poll() is None:
                tuner.kill()
    log = (tmp_path / "tuner.log").read_text()
    assert returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "interrupted by SIGTERM" in log and "rerun the same command to resume" in log
    assert survivors(str(tmp_path)) == []  # no torchrun, no worker left behind

    study = load(tmp_path)
    interrupted = interrupted_trials(study, slots)

    rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    study = load(tmp_path)
    assert [t.number for t in study.trials if t.user_attrs.get("interrupted")] == [t.number for t in interrupted]
    for t in interrupted:  # each interrupted configuration measured again, once
        (retry,) = [r for r in study.trials if r.user_attrs.get("retry_of") == t.number]
        assert retry.state == TrialState.COMPLETE and retry.user_attrs["identity"] == t.user_attrs["identity"]
    assert sum(counted(t) for t in study.trials) == 3  # the interrupted trials are not counted
    identities = [t.user_attrs["identity"] for t in measured_trials(study)
                  if t.user_attrs.get("remeasure_of") is None]  # a near-miss prune measured once more is meant
    assert len(identities) == len(set(identities))  # nothing measured twice


def test_a_set_interrupt_kills_a_running_trial_and_starts_no_other(tmp_path: Path) -> None:
    stop = threading.Event()
    trial_dir = tmp_path / "t"

    def stop_in_windows() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not any(e["event"] == "window" for e in read_progress(trial_dir)):
            time.sleep(0.1)
        stop.set()

    watcher = threading.Thread(target=stop_in_windows)
    watcher.start()
    with pytest.raises(Interrupted):
        launch(trial_dir, make_spec({"compile.scope": "none"}, model=SLOW_TINY, windows=50), interrupt=stop)
    stopped_s = time.time()
    watcher.join()
    assert survivors(str(trial_dir.resolve())) == []
    assert json.loads((trial_dir / "result.json").read_text())["status"] == "interrupted"
    assert any(e["event"] == "window" for e in read_progress(trial_dir))  # it was stopped mid-measurement
    assert stopped_s - os.path.getmtime(trial_dir / "progress.jsonl") < 10

    with pytest.raises(Interrupted):
        launch(tmp_path / "later", make_spec({"compile.scope": "none"}), interrupt=stop)
    assert not (tmp_path / "later").exists()


def replay_cache(cmd_txt: Path, cmd: list[str], tmpdir: Path) -> str:
    """Run cmd.txt's replay line with the trial command swapped for one that prints the cache it got (its
    ``mktemp -d`` under ``tmpdir``, so the test leaves nothing in the system's temporary directory)."""
    line = cmd_txt.read_text().splitlines()[0]
    assert shlex.join(cmd) in line
    show = shlex.join([sys.executable, "-c", "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'], "
                       "os.environ['TRITON_CACHE_DIR'])"])
    tmpdir.mkdir(exist_ok=True)
    out = subprocess.run(["bash", "-c", line.replace(shlex.join(cmd), show)], capture_output=True, text=True,
                         check=True, env={**os.environ, "TMPDIR": str(tmpdir)}).stdout.split()
    return out[0] if out[1] == os.path.join(out[0], "triton") else f"mismatch: {out}"


def test_a_cold_trial_replays_cold_and_a_warm_one_with_the_shared_cache(tmp_path: Path) -> None:
    spec = make_spec({"compile.scope": "module"})
    cmd, extra = prepare(tmp_path / "cold", spec)
    kept = extra["TORCHINDUCTOR_CACHE_DIR"]
    assert kept == str((tmp_path / "cold" / "inductor_cache").resolve())  # the trial itself keeps its cache
    assert kept not in (tmp_path / "cold" / "cmd.txt").read_text()
    replays = tmp_path / "replays"
    first, second = (replay_cache(tmp_path / "cold" / "cmd.txt", cmd, replays) for _ in range(2))
    assert first != second and not os.listdir(first)  # a new, empty cache at every replay
    assert first.startswith(str(replays)) and not first.startswith(str(tmp_path / "cold"))

    warm = tmp_path / "warm_cache"
    cmd, _ = prepare(tmp_path / "warm", spec, cache_dir=warm)
    assert replay_cache(tmp_path / "warm" / "cmd.txt", cmd, tmp_path / "replays") == str(warm.resolve())


def test_the_child_sets_its_parent_death_signal_without_loading_a_library(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher._PRCTL is not None  # Linux with glibc: loaded once, at import

    def no_dlopen(*args: object, **kwargs: object) -> None:
        raise AssertionError("ctypes.CDLL called after fork")

    monkeypatch.setattr(ctypes, "CDLL", no_dlopen)
    children: list[subprocess.Popen[bytes]] = []

    def spawn() -> None:  # the signal is tied to the thread that forked: here one that ends at once
        children.append(subprocess.Popen(["sleep", "60"], preexec_fn=functools.partial(launcher._child_setup, ())))

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    assert children[0].wait(timeout=10) == -signal.SIGTERM
