"""The machine split into trial slots: each slot's GPUs or CPU cores, its processes' threads, and how many of its
trial processes are in flight at once (one of them timed, the machine's lease: :mod:`autocompile.trial.lease`)."""

from __future__ import annotations

import os

import psutil

from autocompile.config.gpus import free_memory, visible_gpus
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


AUTO_MAX = 8
"""The most processes in flight per slot that ``launch.concurrency=0`` picks: past a few, the timed parts (one at a
time) are the wall, not the compiles."""
MEMORY_MARGIN = 1.5
"""A process in flight may need this much more than the reference's peak: compile buffers, another program."""
MIN_PROCESS_BYTES = 1 << 30
"""What a CPU process holds at least (Python, torch, inductor's compile workers), whatever its model's peak."""


def in_flight(settings: Settings, resources: Resources, peak_bytes: float | None, memory: bool = True) -> int:
    """Trial processes in flight on one slot: ``launch.concurrency``, or what the slot allows: a compile keeps one
    core busy per process, and every process in flight holds its memory (paused ones too), ``peak_bytes`` (the
    reference run's peak, per process) with a margin, in the slot's GPU or the machine's free memory."""
    if settings.launch.concurrency:
        return settings.launch.concurrency
    cores = len(resources.cpus) or len(os.sched_getaffinity(0))
    by_cores = max(1, cores // settings.workload.nproc_per_node)
    # A quick answer (the estimate): the cores' bound alone.
    by_memory = memory_room(settings, resources, peak_bytes) if memory else AUTO_MAX
    return max(1, min(by_cores, by_memory, AUTO_MAX))


def memory_room(settings: Settings, resources: Resources, peak_bytes: float | None) -> int:
    """How many trial processes the slot's memory holds at once: ``peak_bytes`` each with a margin, in the slot's
    GPU or the machine's free memory (:data:`AUTO_MAX` when the peak or the free memory is not known)."""
    need = max(peak_bytes or 0.0, 0.0) * MEMORY_MARGIN
    if settings.device == "cuda":
        free = free_memory(resources.gpus[0] if resources.gpus else None)
        return int(free // need) if free and need else AUTO_MAX
    return int(psutil.virtual_memory().available // (settings.workload.nproc_per_node * max(need, MIN_PROCESS_BYTES)))


def flights(settings: Settings, peak_bytes: float | None) -> list[Resources]:
    """:func:`slots`, each repeated by its :func:`in_flight`: one tuner thread per process in flight."""
    return [r for r in slots(settings) for _ in range(in_flight(settings, r, peak_bytes))]
