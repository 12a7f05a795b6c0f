"""A timed process's turn on the measured device, as the process sees it: ask, wait for the grant, say when done.

When its launcher leases the device (``AUTOCOMPILE_LEASE`` in the environment, :mod:`autocompile.trial.lease`),
rank 0 of a process writes ``lease_wait`` to ``progress.jsonl`` once it has compiled and waits for
``lease.granted`` in its directory: the launcher writes it once every other trial process of this machine is
paused. The timed windows run in that turn; ``lease_done`` gives the device back (the launcher also takes it back
when the process ends, whatever ended it). The other ranks meet rank 0 at the caller's next collective.

Standard library only: it runs in the workers and in a user's script's process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LEASE_ENV = "AUTOCOMPILE_LEASE"
"""Set by the launcher when it leases the device: the process waits for its turn before timing."""
GRANTED = "lease.granted"
"""The file the launcher writes in the process's directory when the turn is its own."""
POLL_S = 0.005

Progress = Callable[..., Any]


def leased() -> bool:
    return bool(os.environ.get(LEASE_ENV))


def wait_turn(out_dir: Path, rank: int, progress: Progress) -> float:
    """Block rank 0 until the device is this process's alone; returns the seconds it waited (0 unleased)."""
    if rank != 0 or not leased():
        return 0.0
    progress("lease_wait")
    start = time.time()
    granted = out_dir / GRANTED
    while not granted.exists():
        time.sleep(POLL_S)
    waited = time.time() - start
    progress("lease_granted", waited_s=waited)
    return waited


def end_turn(rank: int, progress: Progress) -> None:
    """The timed part is over: the device may go to the next process."""
    if rank == 0 and leased():
        progress("lease_done")
