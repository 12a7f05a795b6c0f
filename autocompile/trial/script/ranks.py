"""The script's processes seen together: the device the meter reads, clocks synchronised with it, and the
values every rank must agree on (the largest over the ranks).

Torch only: this runs inside the user's processes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def device_of(spec_device: str) -> torch.device:
    """The device the trial measures on (``spec.device``), as this process sees it."""
    if spec_device == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
