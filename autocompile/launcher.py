"""Run one trial under torchrun in a fresh process tree and collect its result.

Each trial gets its own directory: ``trial.json`` (what to run), ``cmd.txt`` (the exact command,
replayable by hand), ``stdout.log``/``stderr.log``, ``progress.jsonl`` and ``result.json``, and
its own inductor cache (a cold compile, as a new job pays) unless a shared warm cache is asked for.
The launcher never trusts the tree to end by itself: on timeout or prune it ends every process
it started, including workers that torchrun put in sessions of their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from autocompile.spec import TrialSpec, write_json_atomic

log = logging.getLogger(__name__)

StopRule = Callable[[list[dict[str, Any]], float], "str | None"]
"""Called while a trial runs with its progress events and seconds since launch; a string stops it."""


def torchrun_command(trial_dir: Path, spec: TrialSpec) -> list[str]:
    workload = spec.workload
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={workload.nnodes}",
        f"--nproc-per-node={workload.nproc_per_node}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",  # a free port: concurrent trials never collide
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        "--max-restarts=0",
        "-m", "autocompile.worker", str(trial_dir.resolve()),
    ]


def trial_environment(trial_dir: Path, spec: TrialSpec, cache_dir: Path | None) -> dict[str, str]:
    """Variables that differ from the tuner's own: cache, threads, import path."""
    cache = (cache_dir or trial_dir / "inductor_cache").resolve()
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        # Thread count changes compile time and the cache key: pinned per trial.
        "OMP_NUM_THREADS": str(spec.threads),
        "PYTHONUNBUFFERED": "1",
        # User model factories import in workers as they do in the tuner.
        "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p),
    }


def prepare(trial_dir: Path, spec: TrialSpec, cache_dir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """Write the trial directory; returns the command and its extra environment."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_dir)
    cmd = torchrun_command(trial_dir, spec)
    extra = trial_environment(trial_dir, spec, cache_dir)
    replay = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
    (trial_dir / "cmd.txt").write_text(
        f"cd {shlex.quote(os.getcwd())} && {replay} {shlex.join(cmd)}\n"
        f"# one process, no torchrun (world size 1): {replay} "
        f"{shlex.join([sys.executable, '-m', 'autocompile.worker', str(trial_dir.resolve())])}\n"
    )
    return cmd, extra


def launch(
    trial_dir: Path,
    spec: TrialSpec,
    *,
    cache_dir: Path | None = None,
    should_stop: StopRule | None = None,
    poll_s: float = 0.25,
) -> dict[str, Any]:
    """Run the trial to its end, its timeout, or until ``should_stop`` says why not; return the result."""
    cmd, extra = prepare(trial_dir, spec, cache_dir)
    for stale in ("result.json", "progress.jsonl", *(p.name for p in trial_dir.glob("error.rank*.json"))):
        (trial_dir / stale).unlink(missing_ok=True)
    started = time.time()
    env = {**os.environ, **extra, "AUTOCOMPILE_LAUNCH_TIME": repr(started)}
    with open(trial_dir / "stdout.log", "wb") as out, open(trial_dir / "stderr.log", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        stopped: tuple[str, str] | None = None
        while proc.poll() is None:
            elapsed = time.time() - started
            if elapsed > spec.measure.timeout_s:
                stopped = ("timeout", f"exceeded measure.timeout_s={spec.measure.timeout_s:g}s; process tree killed")
            elif should_stop is not None and (why := should_stop(read_progress(trial_dir), elapsed)):
                stopped = ("pruned", why)
            if stopped:
                kill_tree(proc)
                break
            time.sleep(poll_s)
    wall_s = time.time() - started
    result = collect(trial_dir, proc.returncode, stopped)
    result["wall_s"] = wall_s
    result["trial_dir"] = str(trial_dir)
    write_json_atomic(trial_dir / "result.json", result)
    return result


def collect(trial_dir: Path, returncode: int | None, stopped: tuple[str, str] | None) -> dict[str, Any]:
    """The trial's outcome from what it left behind; a rank's own error beats a torn-down rank 0."""
    if stopped is not None:
        kind, why = stopped
        if kind == "pruned":
            return {"status": "pruned", "reason": why}
        return {"status": "failed", "failure": "timeout", "reason": why}
    path = trial_dir / "result.json"
    result = json.loads(path.read_text()) if path.exists() else None
    errors = sorted(trial_dir.glob("error.rank*.json"))
    if errors and (result is None or result.get("status") != "ok"):
        return json.loads(errors[0].read_text())
    if result is not None:
        return result
    tail = (trial_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-3:]
    return {"status": "failed", "failure": "crash",
            "reason": f"exit code {returncode}, no result written: " + " | ".join(tail)[-800:]}


def read_progress(trial_dir: Path) -> list[dict[str, Any]]:
    path = trial_dir / "progress.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return events


def kill_tree(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """End torchrun and everything under it, including workers in their own sessions.

    The tree is listed before torchrun is signalled: once it dies, its workers are re-parented
    and can no longer be found from it.
    """
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree.extend(p.children(recursive=True))
    for p in tree:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(tree, timeout=grace_s)
    proc.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM torchrun if the tuner dies (kill -9 included), and torchrun
    then tears its workers down, so a killed study leaves no trial running behind it (Linux only)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _signal(p: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        p.send_signal(sig)
