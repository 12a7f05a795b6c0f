"""Where a trial's wall time went: tuner overhead, compile, timed steps, teardown."""

from __future__ import annotations

from autocompile.trial.timing.result import TrialResult


def wall_split(result: TrialResult) -> dict[str, float]:
    """Seconds per phase from the worker's timestamps and the launcher's wall time.

    ``overhead`` (process start, imports, model build, DDP setup) and ``teardown`` are what the
    tuner costs on top of the job; ``warmup`` is where compilation happens. With other processes in flight
    (``launch.concurrency``), the seconds it waited for its turn on the device (``waited``, between warm-up and
    timed; near 0 alone, always present) are their own part; those it was paused while another timed lie inside
    the parts they fell in (``TrialResult.lease``).
    """
    t = result.timeline or {}
    if not {"launch", "build_done", "warmup_done", "timed_done"} <= t.keys() or result.wall_s is None:
        return {}
    waited = (result.lease or {}).get("waited_s", 0.0)
    return {
        "overhead_start_s": t["worker_start"] - t["launch"],
        "overhead_imports_s": t["imports_done"] - t["worker_start"],
        "overhead_build_s": t["build_done"] - t["imports_done"],
        "warmup_s": t["warmup_done"] - t["build_done"],
        "waited_s": waited,
        "timed_s": t["timed_done"] - t["warmup_done"] - waited,
        "teardown_s": t["launch"] + result.wall_s - t["timed_done"],
    }
