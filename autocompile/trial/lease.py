"""The measured device, leased to one timed process at a time on this machine; every other trial process paused.

Process start, imports, the model's build and its compile are CPU work the device need not wait for: trials do
them side by side (``launch.concurrency``). Only the timed part (and its settle steps) must have the machine
alone. A process that has compiled asks for its turn (:mod:`autocompile.trial.timing.turn`: a ``lease_wait``
progress event, then it waits for ``lease.granted``). Its tuner takes the machine's lease, an exclusive ``flock``
on a file shared by every tuner of this user on this machine (the lease is the machine's, not the tuner's: two
studies on one machine take turns too), one file per GPU on CUDA and one for the CPU. It pauses every other trial
process it runs (SIGSTOP to the whole tree: inductor's compile workers too), and grants once the other tuners,
which look at the lock every tick, have paused theirs. The lease ends at ``lease_done`` or when the process
ends, whatever ended it; the lock dies with a killed tuner. Paused trees resume (SIGCONT) when no one else holds
what they need.

What a process spent paused or waiting is its own record (:class:`Member`): the launcher's timeout and stop rules
do not count it, and the compile time it measured is corrected by the pauses inside its warm-up. A stopped process
cannot act on a signal: :mod:`autocompile.trial.pause_guard` resumes whatever is left stopped when its tuner dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from autocompile.trial.timing.turn import GRANTED

log = logging.getLogger(__name__)

TICK_S = 0.02
"""How often a tuner looks at its trials' progress and at the machine's locks."""
SETTLE_S = 0.08
"""From taking the lock to the grant: the other tuners' next ticks pause their trials in it."""
Interval = tuple[float, float]


def lease_dir() -> Path:
    """Where the machine's lock files are: ``AUTOCOMPILE_LEASE_DIR``, or the user's cache."""
    return _lease_dir(os.environ.get("AUTOCOMPILE_LEASE_DIR", ""))


@functools.cache
def _lease_dir(given: str) -> Path:
    # Made once per directory: the tick reads it 50 times a second.
    root = Path(given) if given else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autocompile"
    path = root if given else root / "lease"
    path.mkdir(parents=True, exist_ok=True)
    return path


def lease_names(device: str, gpus: Sequence[str]) -> tuple[str, ...]:
    """The locks a process's timed part needs: each of its GPUs on CUDA, the CPU's otherwise."""
    if device == "cuda":
        from autocompile.config.gpus import visible_gpus

        return tuple(f"cuda-{g}" for g in (gpus or visible_gpus())) or ("cuda",)
    return ("cpu",)


def _overlap(intervals: list[Interval], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


@dataclass(eq=False)
class Member:
    """One launched process tree of this tuner, as the lease sees it."""

    trial_dir: Path
    names: tuple[str, ...]
    roots: list[int]
    offset: int = 0
    """Bytes of ``progress.jsonl`` read so far."""
    wait_since: float | None = None
    """It asked for its turn then (its own clock) and has not been granted yet."""
    fds: list[int] = field(default_factory=list)
    """The locks it holds (open file descriptors)."""
    taken_at: float | None = None
    granted: bool = False
    turn_over: bool = False
    compiling: bool = False
    paused_since: float | None = None
    stopped: set[int] = field(default_factory=set)
    rechecked: bool = False
    pauses: list[Interval] = field(default_factory=list)
    waits: list[Interval] = field(default_factory=list)
    shared_compile_s: float = 0.0
    """Seconds of its warm-up (compile) during which another of this tuner's processes ran too."""

    @property
    def holds(self) -> bool:
        return bool(self.fds)

    def idle_s(self, now: float | None = None) -> float:
        """Seconds it spent paused or waiting for its turn: not its own work, not counted against its timeout."""
        now = time.time() if now is None else now
        open_ = [(self.paused_since, now)] if self.paused_since is not None else []
        waiting = [(self.wait_since, now)] if self.wait_since is not None else []
        return sum(b - a for a, b in self.pauses + open_ + self.waits + waiting)

    def paused_within(self, start: float, end: float) -> float:
        return _overlap(self.pauses, start, end)

    def summary(self) -> dict[str, Any]:
        """What the result keeps (``TrialResult.lease``)."""
        return {"paused_s": round(sum(b - a for a, b in self.pauses), 3), "pauses": len(self.pauses),
                "waited_s": round(sum(b - a for a, b in self.waits), 3),
                "shared_compile_s": round(self.shared_compile_s, 3)}


class Machine:
    """This tuner's side of the machine's lease: its process trees, which of them holds the device, which are paused.

    One per tuner process (:data:`MACHINE`); every launch joins it, from any slot thread. A thread ticks while any
    process is a member."""

    def __init__(self, tick_s: float = TICK_S, settle_s: float = SETTLE_S) -> None:
        self.tick_s, self.settle_s = tick_s, settle_s
        self.lock = threading.RLock()
        self.members: list[Member] = []
        self.probes: dict[str, int] = {}
        self.thread: threading.Thread | None = None
        self.guard: subprocess.Popen[bytes] | None = None
        self.last = time.time()
        self.published = 0

    # -- what the launcher calls ---------------------------------------------------------------------------------
    def join(self, trial_dir: Path, names: tuple[str, ...], pids: list[int]) -> Member:
        member = Member(trial_dir, names, pids)
        with self.lock:
            self.members.append(member)
            self._tick(member_only=member)  # paused at once if another holds the device now
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="lease", daemon=True)
                self.thread.start()
        return member

    def leave(self, member: Member) -> None:
        """The process ended or is being ended: its lock released, its tree resumed (a kill then lands)."""
        with self.lock:
            now = time.time()
            self._release(member)
            if member.paused_since is not None:
                self._resume(member, now)
            if member.wait_since is not None:
                member.waits.append((member.wait_since, now))
                member.wait_since = None
            if member in self.members:
                self.members.remove(member)
            if not self.members:
                self._close()

    def paused(self, trial_dir: Path) -> bool:
        """Whether the process in ``trial_dir`` is paused now (the live view says so)."""
        with self.lock:
            return any(m.trial_dir == trial_dir and m.paused_since is not None for m in self.members)

    # -- the tick ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            time.sleep(self.tick_s)
            with self.lock:
                if not self.members:
                    return
                try:
                    self._tick()
                except Exception:
                    log.exception("lease tick failed")

    def _tick(self, member_only: Member | None = None) -> None:
        now = time.time()
        members = [member_only] if member_only else self.members
        for m in members:
            self._read(m)
            if m.holds and m.turn_over:
                self._release(m)
        for m in sorted((m for m in self.members if m.wait_since is not None and not m.holds),
                        key=lambda m: m.wait_since or 0.0):
            self._take(m, now)
        held_here = {n for m in self.members if m.holds for n in m.names}
        foreign = {n for n in {n for m in members for n in m.names} - held_here if self._held_elsewhere(n)}
        for m in members:
            pause = not m.holds and any(n in held_here or n in foreign for n in m.names)
            if pause and m.paused_since is None:
                self._pause(m, now)
            elif pause and not m.rechecked:
                self._pause(m, now)  # a child forked as the tree was being stopped
            elif not pause and m.paused_since is not None:
                self._resume(m, now)
        for m in self.members:
            # Written again whenever it is missing: another launch in the same directory (two tuners measuring one
            # study's reference) removes it, and a process never granted would hold the machine's lock for ever.
            if m.holds and not m.turn_over and now - (m.taken_at or now) >= self.settle_s and (
                    not m.granted or not (m.trial_dir / GRANTED).exists()):
                (m.trial_dir / GRANTED).write_text(json.dumps({"time": now, "names": list(m.names)}))
                m.granted = True
                if m.wait_since is not None:
                    m.waits.append((m.wait_since, now))
                    m.wait_since = None
        if member_only is None:
            dt, self.last = now - self.last, now
            running = [m for m in self.members if m.paused_since is None and m.wait_since is None]
            self._publish(len(running))
            if len(running) + self._running_elsewhere() > 1:
                for m in running:
                    m.shared_compile_s += dt if m.compiling else 0.0

    def _read(self, m: Member) -> None:
        """New progress events: its turn asked for or over, its compile begun or ended."""
        path = m.trial_dir / "progress.jsonl"
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < m.offset:  # replaced by another launch in the same directory
                    m.offset = 0
                f.seek(m.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line being written waits for the next tick
        m.offset += end
        for line in data[:end].splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                kind = event.get("event")
                if kind in ("warmup_start", "candidate_start", "script_started"):
                    m.compiling = True
                elif kind == "lease_wait":
                    m.compiling, m.wait_since = False, float(event.get("time", time.time()))
                elif kind == "lease_done":
                    m.turn_over = True

    # -- the locks ---------------------------------------------------------------------------------------------
    def _take(self, m: Member, now: float) -> None:
        """Every lock ``m`` needs, or none (no two processes each holding part of what the other needs)."""
        fds: list[int] = []
        for name in sorted(m.names):
            fd = os.open(lease_dir() / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                for held in fds:
                    fcntl.flock(held, fcntl.LOCK_UN)
                    os.close(held)
                return
            fds.append(fd)
        m.fds, m.taken_at = fds, now
        log.debug("lease %s taken for %s", ",".join(m.names), m.trial_dir)

    def _release(self, m: Member) -> None:
        for fd in m.fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        m.fds = []

    def _held_elsewhere(self, name: str) -> bool:
        """Another process (another tuner) holds ``name``: a shared lock cannot be had beside its exclusive one."""
        fd = self.probes.get(name)
        if fd is None:
            fd = self.probes[name] = os.open(lease_dir() / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def _publish(self, running: int) -> None:
        """How many of this tuner's processes run now (``active/PID``), for the other tuners' accounts."""
        if running == self.published:
            return
        folder = lease_dir() / "active"
        folder.mkdir(exist_ok=True)
        tmp = folder / f".{os.getpid()}.tmp"
        tmp.write_text(str(running))
        tmp.replace(folder / str(os.getpid()))
        self.published = running

    def _running_elsewhere(self) -> int:
        """Processes the other tuners of this machine run now (a dead tuner's count is removed)."""
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(lease_dir() / "active"):
                if not entry.name.isdigit() or int(entry.name) == os.getpid():
                    continue
                if not psutil.pid_exists(int(entry.name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    continue
                with contextlib.suppress(FileNotFoundError, ValueError):
                    total += int(Path(entry.path).read_text() or 0)
        return total

    # -- pausing -----------------------------------------------------------------------------------------------
    def _pause(self, m: Member, now: float) -> None:
        if m.paused_since is None:
            m.paused_since, m.rechecked = now, False
        else:
            m.rechecked = True
        for p in _tree(m.roots):
            if p.pid in m.stopped:
                continue
            self._tell_guard(f"stop {p.pid}")  # before the signal: a tuner killed in between leaves nothing stopped
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGSTOP)
                m.stopped.add(p.pid)

    def _resume(self, m: Member, now: float) -> None:
        for pid in m.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self._tell_guard(f"cont {pid}")
        m.stopped = set()
        m.pauses.append((m.paused_since or now, now))
        m.paused_since = None

    def _tell_guard(self, line: str) -> None:
        if self.guard is None or self.guard.poll() is not None:
            self.guard = subprocess.Popen([sys.executable, "-m", "autocompile.trial.pause_guard"],
                                          stdin=subprocess.PIPE, start_new_session=True)
        stdin: IO[bytes] | None = self.guard.stdin
        if stdin is not None:
            stdin.write(f"{line}\n".encode())
            stdin.flush()

    def _close(self) -> None:
        """No member left: nothing is stopped; the guard ends with its pipe."""
        if self.guard is not None:
            with contextlib.suppress(OSError):
                if self.guard.stdin is not None:
                    self.guard.stdin.close()
            self.guard.wait()
            self.guard = None
        for fd in self.probes.values():
            os.close(fd)
        self.probes = {}
        with contextlib.suppress(FileNotFoundError):
            (lease_dir() / "active" / str(os.getpid())).unlink()
        self.published = 0


def _tree(roots: list[int]) -> list[psutil.Process]:
    out: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            out += [root, *root.children(recursive=True)]
    return out


MACHINE = Machine()
"""This tuner process's side of the machine's lease."""
