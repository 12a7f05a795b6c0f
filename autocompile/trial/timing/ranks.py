"""A timed process's ranks seen together, the one rank helper of every driver (model trial, side by side, script):
the device it measures, its synchronisation, and the values every rank must agree on (the largest over the ranks,
so every rank's scheduler decides alike).

Torch only: this runs inside the user's processes too.
"""

from __future__ import annotations

import atexit
import os
import sys

import torch
import torch.distributed as dist


def device_of(spec_device: str) -> torch.device:
    """The device the trial measures on (``spec.device``), as this process sees it."""
    if spec_device == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def timed_device() -> torch.device:
    """The device a script's windows are timed on, read when they start: CUDA once the script has initialised it
    (its work is queued there), else the CPU (a script on the CPU of a GPU machine: events would time nothing)."""
    return torch.device("cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu")


def sync() -> None:
    """Wait for the device's queued work, so a clock read after it covers that work."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def reduce_max(values: list[float]) -> list[float]:
    """Each value's largest over the ranks (unchanged in one process)."""
    if not distributed():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def agree(value: float) -> float:
    """The largest ``value`` over the ranks: every rank takes the same branch."""
    return reduce_max([value])[0]


def rank0_says(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (a decision whose steps are collective)."""
    if not distributed():
        return flag
    t = torch.tensor([float(flag)], device=collective_device())
    dist.broadcast(t, src=0)
    return bool(t.item())


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: after dynamo is loaded, freeing every module takes
    about 2 s per process (more than this tiny trial's timed part), which each trial would pay.
    Exit handlers still run (inductor's compile workers stop), and the streams are flushed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
