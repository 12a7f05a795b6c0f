"""Where a trial's wall time went: tuner overhead, compile, timed steps, teardown."""

from __future__ import annotations

from autocompile.trial.timing.result import TrialResult


def wall_split(result: TrialResult) -> dict[str, float]:
    """Seconds per phase from the worker's timestamps and the launcher's wall time.

    ``overhead`` (process start, imports, model build, DDP setup) and ``teardown`` are what the
    tuner costs on top of the job; ``warmup`` is where compilation happens.
    """
    t = result.timeline or {}
    if not {"launch", "build_done", "warmup_done", "timed_done"} <= t.keys() or result.wall_s is None:
        return {}
    return {
        "overhead_start_s": t["worker_start"] - t["launch"],
        "overhead_imports_s": t["imports_done"] - t["worker_start"],
        "overhead_build_s": t["build_done"] - t["imports_done"],
        "warmup_s": t["warmup_done"] - t["build_done"],
        "timed_s": t["timed_done"] - t["warmup_done"],
        "teardown_s": t["launch"] + result.wall_s - t["timed_done"],
    }
