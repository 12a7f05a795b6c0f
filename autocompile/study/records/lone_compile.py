"""A compile that shared the machine, as a lone run would have taken it: what the objective and the report read.

With processes in flight (``launch.concurrency``) a compile often runs while another process builds or compiles: on
a CPU they share the cores, and its wall time grows (1.33-1.38x for gpt2-tiny's module compile beside a train-step
compile on the 2-core VM, ``benchmarks/results/cpu-2core/issue51/README.md``), while the CPU seconds it needs grow
by 3-11 % (so the price below errs high by about that). A compile that shared the machine for more than
:data:`SHARED_MAX` of it is priced as its CPU seconds (``TrialResult.compile_cpu_s``) over the rate at which this
study's compiles that ran alone turned CPU seconds into wall seconds (:func:`lone_rate`; before there are
:data:`MIN_LONE` of them, :data:`PRIOR_RATE`). The wall it took stays in ``lease["compile_wall_s"]``; the rate, what it
stood on and its spread in ``lease["compile_basis"]``. Pauses (another process timing) are never compile time: the
launcher took them out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from autocompile.trial.timing.result import TrialResult

SHARED_MAX = 0.1
"""A compile that shared the machine for less than this share of its wall time counts as alone."""
MIN_S = 1.0
"""Compiles shorter than this are neither priced as alone nor a lone rate: an eager program's first steps, or a
compile too short for its CPU seconds to say anything."""
MIN_LONE = 2
"""Lone compiles of the study before their rate replaces the prior."""
PRIOR_RATE = 1.2
"""CPU seconds per wall second of a lone compile before the study has measured its own: Python's tracing keeps one
core busy, inductor's C++ compiles a second one part of the time (gpt2-tiny on the 2-core VM: 1.23 for the module
compile, 1.19 for the train step's, the same in every repeat, ``benchmarks/results/cpu-2core/issue51/README.md``). A
machine of many cores compiles wider: there the study's own lone compiles replace it."""


def shared_share(result: TrialResult) -> float:
    """The share of its compile's wall time during which another process in flight on this machine ran."""
    lease = result.lease or {}
    wall = lease.get("compile_wall_s", result.compile_s) or 0.0
    return min(1.0, lease.get("shared_compile_s", 0.0) / wall) if wall > 0 else 0.0


def rate_of(result: TrialResult) -> float | None:
    """CPU seconds per wall second of a compile that ran alone, or None (shared, or nothing to read)."""
    if result.compile_cpu_s is None or not result.compile_s or result.compile_s < MIN_S or shared_share(result) > \
            SHARED_MAX:
        return None
    return result.compile_cpu_s / result.compile_s


def lone_rate(results: Iterable[TrialResult]) -> tuple[float, str]:
    """The study's lone-compile rate, and what it stands on (in words, with its spread)."""
    rates = [r for r in (rate_of(x) for x in results) if r is not None]
    if len(rates) < MIN_LONE:
        return PRIOR_RATE, f"the prior rate {PRIOR_RATE:g} CPU s per s ({len(rates)} lone compile(s) measured so far)"
    rate = statistics.median(rates)
    spread = statistics.stdev(rates) / statistics.fmean(rates) if len(rates) > 1 else 0.0
    return rate, f"{rate:.2f} CPU s per s, the median of {len(rates)} lone compiles (cv {spread:.0%})"


def as_alone(result: TrialResult, rate: tuple[float, str]) -> None:
    """``result.compile_s`` as a lone run's when its compile shared the machine (in place; the wall one kept)."""
    if result.compile_s is None or result.compile_s < MIN_S or result.compile_cpu_s is None or \
            shared_share(result) <= SHARED_MAX:
        return  # an eager program's first steps are no compile to price
    lease = result.lease if result.lease is not None else {}
    lease["compile_wall_s"] = round(result.compile_s, 3)
    result.compile_s = result.compile_cpu_s / rate[0]
    lease["compile_basis"] = rate[1]
    result.lease = lease


def describe(results: Iterable[TrialResult]) -> str | None:
    """How many of a study's compiles shared the machine and were priced as alone, on what, and how far their wall
    was from it (None when none shared)."""
    measured = [r for r in results if r.compile_s is not None]
    priced = [r for r in measured if r.lease and "compile_wall_s" in r.lease]
    if not priced:
        return None
    ratios = [r.lease["compile_wall_s"] / r.compile_s for r in priced if r.lease and r.compile_s]
    if not ratios:
        return None
    over = statistics.median(ratios)
    basis = priced[-1].lease.get("compile_basis", "") if priced[-1].lease else ""
    return (f"{len(priced)} of {len(measured)} compiles shared the machine with processes in flight: each priced as "
            f"a lone run's, its CPU seconds at {basis} (their wall took x{over:.2f} that, median; kept as "
            "compile_wall_s in each result)")
