"""The device lease (``autocompile.trial.lease``): trial processes in flight together, one timed at a time, the others
paused; what a pause leaves behind when the timed process fails, hangs or dies, or when the tuner is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from autocompile.trial.launcher import launch
from autocompile.trial.timing.result import TrialResult
from tests.conftest import make_spec, survivors, tiny_lm
from tests.test_tuner import TINY

ROOT = Path(__file__).resolve().parent.parent


def timed_spans(root: Path) -> list[tuple[float, float, str]]:
    """Every timed window under ``root`` (a study's trials, its reference, side-by-side processes): start, end and
    the process directory, from the ``window`` and ``round`` events the processes wrote."""
    spans = []
    for path in root.rglob("progress.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "window":
                spans.append((event["time"] - event["seconds"], event["time"], str(path.parent)))
    return sorted(spans)


def turns(root: Path) -> list[tuple[float, float, str]]:
    """Every process's turn on the device under ``root``: ``lease_granted`` to ``lease_done`` (or its last event)."""
    spans = []
    for path in root.rglob("progress.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        start = next((e["time"] for e in events if e["event"] == "lease_granted"), None)
        if start is not None:
            end = next((e["time"] for e in events if e["event"] == "lease_done"), events[-1]["time"])
            spans.append((start, end, str(path.parent)))
    return sorted(spans)


def overlaps(spans: list[tuple[float, float, str]]) -> list[tuple[Any, Any]]:
    """Pairs of windows of two different processes that ran at the same time."""
    return [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:] if b[0] < a[1] and b[2] != a[2]]


def study(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_trials_in_flight_together_never_time_at_once(tmp_path: Path) -> None:
    # Two trials in flight, with a test model slow enough for one's windows to meet the other's build and compile.
    run = study(tmp_path, "launch.concurrency=2", "+model.block_sleep_s=0.004", "compile.scope=none",
                "study.n_trials=4", "study.prune=false", "measure.windows=6")
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out.decode()[-3000:]
    spans = timed_spans(tmp_path)
    assert len({s[2] for s in spans}) >= 3  # the reference and trials, each with its windows
    assert overlaps(spans) == [] and overlaps(turns(tmp_path)) == []
    results = [TrialResult.from_json(json.loads(p.read_text())) for p in tmp_path.glob("*/trials/*/result.json")]
    leases = [r.lease for r in results if r.lease]
    assert len(leases) == len(results)
    # They were in flight together: one waited paused while another timed.
    assert any(lease["paused_s"] > 0 for lease in leases), leases


def launch_in_thread(trial_dir: Path, spec: Any, out: dict[str, TrialResult]) -> threading.Thread:
    thread = threading.Thread(target=lambda: out.setdefault(trial_dir.name, launch(trial_dir, spec)))
    thread.start()
    return thread


def granted(trial_dir: Path) -> bool:
    path = trial_dir / "progress.jsonl"
    return path.exists() and '"lease_granted"' in path.read_text()


def tree_states(trial_dir: Path) -> set[str]:
    """The states of the processes running in ``trial_dir`` (by its path on their command line)."""
    states = set()
    for p in psutil.process_iter(["cmdline", "status"]):
        if str(trial_dir.resolve()) in " ".join(p.info["cmdline"] or []):
            states.add(p.info["status"])
    return states


def wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("behaviour", ["hang_when_timed",
                                       pytest.param("raise_when_timed", marks=pytest.mark.integration),
                                       pytest.param("killed_when_timed", marks=pytest.mark.integration)])
def test_a_paused_process_resumes_when_the_timed_one_fails_hangs_or_dies(tmp_path: Path, behaviour: str) -> None:
    holder, paused = tmp_path / "holder", tmp_path / "paused"
    results: dict[str, TrialResult] = {}
    threads = [launch_in_thread(holder, make_spec({"compile.scope": "none"}, model=tiny_lm(behaviour),
                                                  timeout_s=25.0), results)]
    wait_for(lambda: granted(holder))  # the holder times (and misbehaves) from here
    threads.append(launch_in_thread(paused, make_spec({"compile.scope": "none"}), results))
    wait_for(lambda: (paused / "progress.jsonl").exists() or "stopped" in tree_states(paused))
    wait_for(lambda: "stopped" in tree_states(paused) or holder.name in results)
    if behaviour == "hang_when_timed":  # paused for as long as the holder hangs
        assert tree_states(paused) == {"stopped"}
    for thread in threads:
        thread.join(timeout=180)
    assert results["holder"].status == "failed"
    expected = {"hang_when_timed": "timeout", "raise_when_timed": "exception", "killed_when_timed": "crash"}
    assert results["holder"].failure == expected[behaviour], results["holder"]
    assert results["paused"].ok, results["paused"].reason
    lease = results["paused"].lease or {}
    if behaviour == "hang_when_timed":
        assert lease["paused_s"] > 5  # the holder's whole hang
        assert results["paused"].wall_s - lease["paused_s"] - lease["waited_s"] < 25  # its own timeout untouched
    assert survivors(str(tmp_path)) == []


@pytest.mark.integration
def test_a_tuner_killed_with_sigkill_leaves_no_stopped_process(tmp_path: Path) -> None:
    run = study(tmp_path, "launch.concurrency=2", "+model.block_sleep_s=0.01", "compile.scope=none",
                "study.n_trials=6", "study.prune=false", "measure.windows=40")
    tuner = psutil.Process(run.pid)
    seen: set[psutil.Process] = set()
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            tree = tuner.children(recursive=True)
            seen |= set(tree)
            if any(p.status() == psutil.STATUS_STOPPED for p in tree if p.is_running()):
                break
            time.sleep(0.05)
        else:
            pytest.fail("no trial was ever paused")
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()
    _, alive = psutil.wait_procs(list(seen), timeout=30)
    stopped = [p for p in alive if p.is_running() and p.status() == psutil.STATUS_STOPPED]
    assert stopped == []
    assert alive == []  # resumed, each heard the SIGTERM of its parent's death
    assert survivors(str(tmp_path)) == []


@pytest.mark.integration
def test_two_tuners_on_one_machine_share_one_lease(tmp_path: Path) -> None:
    shared = {"AUTOCOMPILE_LEASE_DIR": str(tmp_path / "lease")}
    runs = [study(tmp_path / name, "launch.concurrency=1", "+model.block_sleep_s=0.004", "compile.scope=none",
                  "study.n_trials=3", "study.prune=false", "measure.windows=6", env=shared) for name in ("a", "b")]
    for run in runs:
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out.decode()[-3000:]
    spans = timed_spans(tmp_path)
    assert {Path(s[2]).parts[len(tmp_path.parts)] for s in spans} == {"a", "b"}
    assert overlaps(spans) == []
    results = [json.loads(p.read_text()) for p in tmp_path.glob("*/*/trials/*/result.json")]
    assert any(r["lease"]["paused_s"] > 0 or r["lease"]["waited_s"] > 1 for r in results)


@pytest.mark.integration
def test_the_phases_fly_too_and_their_processes_take_turns(tmp_path: Path) -> None:
    # Confirmation and verdicts side by side, their processes (and the verdicts' cold runs) in flight two at a time.
    run = study(tmp_path, "launch.concurrency=2", "compile.backend=aot_eager", "study.n_trials=4", "study.prune=false",
                "study.confirm_top=2", "study.verdicts=all", "compare.max_timed_s=0.5", "compare.min_rounds=2",
                "compare.processes=4")
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out.decode()[-3000:]
    spans = turns(tmp_path)
    assert len([s for s in spans if "/phases/" in s[2]]) >= 4  # side-by-side processes took their turns
    assert overlaps(spans) == [] and overlaps(timed_spans(tmp_path)) == []
    results = [json.loads(p.read_text()) for p in tmp_path.glob("*/phases/*/result.json")]
    assert any(r["lease"]["paused_s"] > 0 or r["lease"]["waited_s"] > 0.5 for r in results)  # they flew together
