"""The machine split into trial slots: each slot's GPUs or CPU cores, and its processes' threads."""

from __future__ import annotations

import os

from autocompile.config.gpus import visible_gpus
from autocompile.config.sections import Resources
from autocompile.config.settings import ConfigError, Settings


def slots(settings: Settings) -> list[Resources]:
    """One entry per parallel trial slot: a partition of this machine's GPUs or CPU cores."""
    w = settings.workload
    if settings.device == "cuda":
        gpus = visible_gpus()
        n = settings.launch.slots or max(1, len(gpus) // w.nproc_per_node)
        if n * w.nproc_per_node > len(gpus):
            raise ConfigError(f"launch.slots={n} x nproc_per_node={w.nproc_per_node} needs {n * w.nproc_per_node}"
                              f" GPUs, {len(gpus)} visible: lower launch.slots")
        # Concurrent slots also get their own cores: compile (inductor's workers follow the
        # affinity) and the Python side of a step would otherwise contend across slots.
        cores = partition(sorted(os.sched_getaffinity(0)), n) if n > 1 else [()] * n
        return [Resources(gpus=tuple(gpus[i * w.nproc_per_node:(i + 1) * w.nproc_per_node]), cpus=cores[i])
                for i in range(n)]
    # On a CPU concurrent trials share memory bandwidth and caches: one slot unless asked.
    cores = sorted(os.sched_getaffinity(0))
    n = settings.launch.slots or 1
    if n == 1:
        return [Resources()]
    per = len(cores) // n
    if per < w.nproc_per_node:
        raise ConfigError(f"launch.slots={n} leaves {per} cores per slot for {w.nproc_per_node} processes: "
                          "lower launch.slots")
    return [Resources(cpus=part) for part in partition(cores, n)]


def slot_threads(settings: Settings, resources: Resources) -> int:
    """Threads per process inside a slot: the slot's cores shared by its processes."""
    if not resources.cpus or settings.workload.threads:
        return settings.threads
    return max(1, len(resources.cpus) // settings.workload.nproc_per_node)


def partition(cores: list[int], n: int) -> list[tuple[int, ...]]:
    """``n`` equal, disjoint runs of ``cores`` (a remainder stays unused)."""
    per = len(cores) // n
    return [tuple(cores[i * per:(i + 1) * per]) for i in range(n)]
