"""Run one trial under torchrun in a fresh process tree and collect its result.

Each trial gets its own directory: ``trial.json`` (what to run), ``cmd.txt`` (the exact command,
replayable by hand), ``stdout.log``/``stderr.log``, ``progress.jsonl`` and ``result.json``, and
its own inductor cache (a cold compile, as a new job pays) unless a shared warm cache is asked for.
The launcher never trusts the tree to end by itself: on timeout, prune or interruption it ends every
process it started, including workers that torchrun put in sessions of their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autocompile.config.script_settings import ScriptSpec
from autocompile.config.sections import Resources
from autocompile.config.spec import SideBySideSpec, TrialSpec, write_json_atomic
from autocompile.trial.lease import MACHINE, Member, lease_names
from autocompile.trial.timing.result import ProgressEvent, TrialResult
from autocompile.trial.timing.turn import GRANTED, LEASE_ENV

log = logging.getLogger(__name__)

Spec = TrialSpec | SideBySideSpec | ScriptSpec
"""What a launch runs: one configuration (the trial worker), several side by side, or the user's script."""

StopRule = Callable[[list[ProgressEvent], float], "str | tuple[str, str] | None"]
"""Called while a trial runs with its progress events and seconds since launch; a reason stops it
as pruned, a ``(status, reason)`` pair with that status (``same_program``)."""

INTERRUPT = threading.Event()
"""Set when the tuner stops (Ctrl-C): every launch in this process kills its trial and raises Interrupted.
Process-wide because the tuner's slots reach ``launch`` through code that does not pass it along."""

INTERRUPTED = ("interrupted", "the tuner was interrupted; process tree killed")
PR_SET_PDEATHSIG = 1


class Interrupted(Exception):
    """The trial was stopped, or not started, because the tuner is stopping: it measured nothing."""


def _load_prctl() -> Callable[..., int] | None:
    # Loaded here, once: dlopen in the forked child of a multithreaded process can deadlock on a
    # lock another thread held at fork time (why Python calls preexec_fn unsafe with threads).
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not glibc Linux: trials just lack the parent-death signal
        return None


_PRCTL = _load_prctl()


INHERIT = Resources()
"""A slot that uses what the tuner has."""


@dataclass(frozen=True)
class Agents:
    """How the torchrun agents of a multi-node trial (workload.nnodes > 1) are started."""

    host: str = "127.0.0.1"
    """Rendezvous host: this machine's address as the other nodes see it."""
    remote: str = ""
    """Command template starting the agent of each further node, ``{cmd}`` being the torchrun command
    (e.g. ``srun --nodes=1 --ntasks=1 {cmd}``); empty: every agent runs on this host."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def torchrun_command(trial_dir: Path, spec: Spec, agents: Agents = Agents()) -> list[str]:
    workload = spec.workload
    # One node: port 0 lets the c10d store pick a free port, so concurrent trials never collide.
    # Several nodes must agree on an endpoint: a free port on the rendezvous host, a unique id.
    endpoint = "localhost:0" if workload.nnodes == 1 else f"{agents.host}:{free_port()}"
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={workload.nnodes}",
        f"--nproc-per-node={workload.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={uuid.uuid4().hex[:12]}",
        "--max-restarts=0",
        # Without it torchrun makes an empty torchelastic_* tree in the system's temp directory per launch
        # (DefaultLogsSpecs: tempfile.mkdtemp(prefix="torchelastic_")); here it stays with the trial.
        f"--log-dir={(trial_dir / 'torchrun').resolve()}",
        *entry(trial_dir, spec),
    ]


def entry(trial_dir: Path, spec: Spec) -> list[str]:
    """What each process runs: a worker module on the trial directory, or what the spec names (the user's
    script: ``config.script.ScriptSpec.entry``)."""
    named = getattr(spec, "entry", None)
    return named(trial_dir) if named else ["-m", spec.module, str(trial_dir.resolve())]


def trial_environment(trial_dir: Path, spec: Spec, cache_dir: Path | None,
                      resources: Resources = INHERIT) -> dict[str, str]:
    """Variables that differ from the tuner's own: cache, threads, import path, devices."""
    cache = (cache_dir or trial_dir / "inductor_cache").resolve()
    devices = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, resources.gpus))} if resources.gpus else {}
    base = {
        **devices,
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        # Thread count changes compile time and the cache key: pinned per trial.
        "OMP_NUM_THREADS": str(spec.threads),
        "PYTHONUNBUFFERED": "1",
        # User model factories import in workers as they do in the tuner.
        "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p),
    }
    own = getattr(spec, "environment", None)  # a script's agent: its trial and its sitecustomize
    return {**base, **own(trial_dir, base)} if own else base


def prepare(trial_dir: Path, spec: Spec, cache_dir: Path | None = None, resources: Resources = INHERIT,
            agents: Agents = Agents()) -> tuple[list[str], dict[str, str]]:
    """Write the trial directory; returns the command and its extra environment."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec.write(trial_dir)
    plain = getattr(spec, "plain_python", None)  # one process, started as its user starts it
    own = getattr(spec, "command", None)  # a script's own launcher (accelerate launch)
    cmd = (own and own(trial_dir)) or ([sys.executable, *entry(trial_dir, spec)] if plain and plain()
                                       else torchrun_command(trial_dir, spec, agents))
    extra = trial_environment(trial_dir, spec, cache_dir, resources)
    (trial_dir / "cmd.txt").write_text(replay_text(trial_dir, spec, cmd, extra, cache_dir, resources))
    return cmd, extra


def replay_text(trial_dir: Path, spec: Spec, cmd: list[str], extra: dict[str, str], cache_dir: Path | None,
                resources: Resources) -> str:
    """``cmd.txt``: the trial's command with its environment, to run again by hand.

    A cold trial's cache stays in its directory (to inspect what inductor built); replaying with it
    would time a warm compile, so the replay gets a fresh cache each time it runs.
    """
    values = {k: shlex.quote(v) for k, v in extra.items()}
    fresh = ""
    if cache_dir is None:
        fresh = "cache=$(mktemp -d) && "
        values |= {"TORCHINDUCTOR_CACHE_DIR": '"$cache"', "TRITON_CACHE_DIR": '"$cache/triton"'}
    replay = " ".join(f"{k}={v}" for k, v in values.items())
    pin = f"taskset -c {','.join(map(str, resources.cpus))} " if resources.cpus else ""
    nodes = f"  # on each of the {spec.workload.nnodes} nodes" if spec.workload.nnodes > 1 else ""
    worker = shlex.join([sys.executable, *entry(trial_dir, spec)])
    return (f"cd {shlex.quote(os.getcwd())} && {fresh}{replay} {pin}{shlex.join(cmd)}{nodes}\n"
            f"# one process, no torchrun (world size 1): {fresh}{replay} {worker}\n")


def launch(
    trial_dir: Path,
    spec: Spec,
    *,
    cache_dir: Path | None = None,
    should_stop: StopRule | None = None,
    resources: Resources = INHERIT,
    agents: Agents = Agents(),
    poll_s: float = 0.25,
    interrupt: threading.Event = INTERRUPT,
) -> TrialResult:
    """Run the trial to its end, its timeout, or until ``should_stop`` says why not; return the result.

    Raises Interrupted once ``interrupt`` is set (the trial's tree killed first, or nothing started),
    and lets a KeyboardInterrupt in the calling thread through after killing the tree: an interrupted
    trial measured nothing, and the caller decides what becomes of it.
    """
    if interrupt.is_set():
        raise Interrupted("the tuner is stopping: trial not started")
    cmd, extra = prepare(trial_dir, spec, cache_dir, resources, agents)
    for stale in ("result.json", "progress.jsonl", GRANTED, *(p.name for p in trial_dir.glob("error.rank*.json"))):
        (trial_dir / stale).unlink(missing_ok=True)
    started = time.time()
    # The trial's own temporary directory, removed with it: what its processes (torchrun's agent, a script's
    # multiprocessing, inductor's workers) leave in it when killed is not left on the machine. Short, under the
    # system's: a Unix socket's path (multiprocessing's listeners) must stay under 108 bytes.
    scratch = scratch_dir()
    env = {**os.environ, **extra, "AUTOCOMPILE_LAUNCH_TIME": repr(started), LEASE_ENV: "1"}
    procs: list[subprocess.Popen[bytes]] = []
    member: Member | None = None
    stopped: tuple[str, str] | None = None
    try:
        with contextlib.ExitStack() as files:
            for node in range(spec.workload.nnodes):
                suffix = "" if node == 0 else f".node{node}"
                out = files.enter_context(open(trial_dir / f"stdout{suffix}.log", "wb"))
                err = files.enter_context(open(trial_dir / f"stderr{suffix}.log", "wb"))
                args: list[str] | str = cmd
                remote = node > 0 and bool(agents.remote)
                if remote:
                    args = agents.remote.format(cmd=shlex.join(cmd), node=node)
                # A remote node's launcher (srun, ssh) may pass the environment on, and this directory is not there.
                own_env = env if remote else {**env, "TMPDIR": scratch}
                procs.append(subprocess.Popen(args, env=own_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                              shell=isinstance(args, str), start_new_session=True,
                                              preexec_fn=functools.partial(_child_setup, resources.cpus)))
            member = MACHINE.join(trial_dir, lease_names(spec.device, resources.gpus), [p.pid for p in procs])
            while any(p.poll() is None for p in procs):
                # Paused, or waiting for its turn on the device: not its own time, neither for its timeout nor
                # for a stop rule.
                if stopped := _why_stop(trial_dir, spec, time.time() - started - member.idle_s(), should_stop,
                                        interrupt):
                    break
                interrupt.wait(poll_s)  # a sleep that ends as soon as the tuner stops
    except KeyboardInterrupt:  # Ctrl-C lands in the thread that launched when the tuner runs one slot
        stopped = INTERRUPTED
        raise
    finally:
        if member is not None:  # its lock released and its tree resumed first: a paused process hears no SIGTERM
            MACHINE.leave(member)
        # Stopped, interrupted, or an error on the way: no process of the trial outlives the launch.
        if stopped or any(p.poll() is None for p in procs):
            for p in procs:
                kill_tree(p)
        (trial_dir / GRANTED).unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if stopped == INTERRUPTED:
            _record(trial_dir, procs, stopped, started, resources, member)
    if stopped == INTERRUPTED:
        raise Interrupted(INTERRUPTED[1])
    return _record(trial_dir, procs, stopped, started, resources, member)


SCRATCH_PREFIX = "autocompile-"
"""A trial's temporary directory: ``<system temp>/autocompile-<tuner pid>-<random>``."""


def scratch_dir() -> str:
    """A new temporary directory for a trial's processes, named for this tuner; those of tuners that are gone (killed
    before their launches' ``finally``) are removed first."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = old.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def _why_stop(trial_dir: Path, spec: Spec, elapsed: float, should_stop: StopRule | None,
              interrupt: threading.Event) -> tuple[str, str] | None:
    """Why a running launch ends now, if it does: the tuner stopping, its timeout, or its stop rule."""
    if interrupt.is_set():
        return INTERRUPTED
    if elapsed > spec.measure.timeout_s:
        return "timeout", f"exceeded measure.timeout_s={spec.measure.timeout_s:g}s; process tree killed"
    if should_stop is not None and (why := should_stop(read_progress(trial_dir), elapsed)):
        return why if isinstance(why, tuple) else ("pruned", why)
    return None


def _record(trial_dir: Path, procs: list[subprocess.Popen[bytes]], stopped: tuple[str, str] | None,
            started: float, resources: Resources, member: Member | None) -> TrialResult:
    """The trial's result.json, written whatever ended it."""
    result = collect(trial_dir, procs[0].returncode if procs else None, stopped)
    result.wall_s = time.time() - started
    result.trial_dir = str(trial_dir)
    if resources.cpus or resources.gpus:
        result.resources = {"cpus": list(resources.cpus), "gpus": list(resources.gpus)}
    if member is not None:
        result.lease = member.summary()
        unpause(result, member)
    write_json_atomic(trial_dir / "result.json", result.to_json())
    return result


def unpause(result: TrialResult, member: Member) -> None:
    """A compile paused while another process timed took that much longer on the wall: the pauses inside its
    warm-up are not compile time (the warm-up steps were timed by the process's own clock)."""
    t = result.timeline or {}
    if result.compile_s is None or not {"build_done", "warmup_done"} <= t.keys():
        return
    paused = member.paused_within(t["build_done"], t["warmup_done"])
    if paused > 0:
        result.compile_s = max(0.0, result.compile_s - paused)
        if result.first_step_s is not None:
            result.first_step_s = max(0.0, result.first_step_s - paused)
        if result.lease is not None:
            result.lease["compile_paused_s"] = round(paused, 3)


def collect(trial_dir: Path, returncode: int | None, stopped: tuple[str, str] | None) -> TrialResult:
    """The trial's outcome from what it left behind; a rank's own error beats a torn-down rank 0."""
    if stopped is not None:
        kind, why = stopped
        if kind in ("pruned", "interrupted", "same_program"):
            # What it compiled before it was stopped, if it got that far.
            compiled = next((e for e in read_progress(trial_dir) if e["event"] == "compiled"), {})
            return TrialResult(status=kind, reason=why, fingerprint=compiled.get("fingerprint"))
        return TrialResult(status="failed", failure="timeout", reason=why)
    path = trial_dir / "result.json"
    result = TrialResult.from_json(json.loads(path.read_text())) if path.exists() else None
    errors = sorted(trial_dir.glob("error.rank*.json"))
    if errors and (result is None or not result.ok):
        return TrialResult.from_json(json.loads(errors[0].read_text()))
    if result is not None:
        if result.failure == "script_ended" and (said := script_said(trial_dir, returncode, result)):
            result.reason = f"{said} ({result.reason})"
        return result
    return TrialResult(status="failed", failure="crash",
                       reason=f"exit code {returncode}, no result written: {output_tail(trial_dir, 3)[-800:]}")


def script_said(trial_dir: Path, returncode: int | None, result: TrialResult) -> str:
    """What a script that ended first said as it ended, before what the agent saw of its steps: its exit code and last
    stderr line when it ended with an error (argparse's usage error, its own ``sys.exit(1)``), its last printed line
    when it ended cleanly before any step (pytorch/examples' FSDP2 example: "Unable to locate sufficient 2 gpus to run
    this example. Exiting."); nothing when it trained a while and then ran out of steps."""
    if returncode:
        return f"the script exited with code {returncode}: {output_tail(trial_dir, 1)[-400:]}"
    if not result.optimizer_steps and (last := output_tail(trial_dir, 1, "stdout")):
        return f"the script ended before its first training step, its last line: {last[-400:]}"
    return ""


def output_tail(trial_dir: Path, lines: int, stream: str = "stderr") -> str:
    """The last ``lines`` lines rank 0 wrote to ``stream`` (its log in the trial's directory), on one line."""
    path = trial_dir / f"{stream}.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def read_progress(trial_dir: Path) -> list[ProgressEvent]:
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


def kill_tree(proc: subprocess.Popen[Any], grace_s: float = 5.0, first: signal.Signals = signal.SIGTERM) -> None:
    """End a process and everything under it, including children in their own sessions (torchrun's
    workers): ``first`` to each, then SIGKILL to what is left after ``grace_s``. The one way autocompile
    stops a process tree (trials, the test MLflow server, scripts/gpu_check.py's stages).

    The tree is listed before the root is signalled: once it dies, its children are re-parented
    and can no longer be found from it.
    """
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        _signal(p, first)
        _signal(p, signal.SIGCONT)  # one stopped (paused by a lease) acts on nothing else
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree.extend(p.children(recursive=True))
    for p in tree:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(tree, timeout=grace_s)
    proc.wait()


def _child_setup(cpus: tuple[int, ...]) -> None:
    """In the child before exec: pin the CPUs of its slot, and SIGTERM torchrun if the tuner dies
    (kill -9 included): torchrun then tears its workers down, so a killed study leaves no trial
    running behind it (Linux only; the signal follows the thread that forked, a slot thread that
    outlives its trials). Runs between fork and exec with other threads frozen: no imports, no dlopen."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    if _PRCTL is not None:  # a plain syscall here: the library was loaded at import, before any fork
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal(p: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        p.send_signal(sig)
