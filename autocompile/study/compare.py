"""``task=compare``: the head-to-head users ask for, timed side by side.

    python -m autocompile +model=gpt2-tiny task=compare \
        'compare.candidates=["compile.scope=none","compile.scope=module"]'

1. Each distinct candidate runs once alone, in a fresh process with a cold inductor cache: its cold
   compile time, peak memory, fingerprint and compile artifacts (what a new job pays).
2. ``compare.processes`` fresh processes then time all candidates side by side (warm from those
   artifacts, each checked to run the program of its cold run), windows in rotating order.
3. Every candidate against the first: the paired change of step time with its 95% interval (windows
   within processes, a random effect per process), of time to train with the cold compiles, when a
   slower-compiling candidate pays back, and a verdict in words. ``compare.json`` in the run directory.

A candidate whose windows changed speed within a process (:func:`autocompile.study.statistics.noise.change_point`) is
named, one line each, and a side-by-side ratio that disagrees with the candidates' cold runs alone beyond
their noise is reported as that disagreement, not as the answer.

A script (``script.path``) is timed side by side inside its own processes: the agent holds every candidate's
compile of the units it takes over and switches them window by window (:mod:`autocompile.trial.script.rotation`).
Candidates that cannot share a process (:func:`sidebyside.cannot_share`, or one that failed beside the
others) are compared in fresh-process rounds instead (one process per candidate and round, paired
by round), and the output says which ran and why.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path

from autocompile.config.choices import FRESH_PROCESSES, SIDE_BY_SIDE
from autocompile.config.compare_settings import label
from autocompile.config.knobs import describe
from autocompile.config.settings import Settings
from autocompile.config.spec import write_json_atomic
from autocompile.study.comparison import ComparePair, CompareRow, Comparison, Failed
from autocompile.study.phases import sidebyside
from autocompile.study.records.compile_prior import prior_for
from autocompile.study.statistics.intervals import (
    Paired,
    break_even,
    from_rounds,
    paired_ratio,
    paired_windows,
    satterthwaite,
    t_quantile,
    time_to_train,
)
from autocompile.study.statistics.noise import change_point
from autocompile.trial.launcher import launch
from autocompile.trial.timing.result import TrialResult

log = logging.getLogger(__name__)

ALONE_CV = 0.086
"""Least relative sd of one candidate's step time across fresh processes alone, for comparing the cold runs'
ratio with the side-by-side one: the largest the studies' records show (6.7-8.6 %, issue 26). A compare runs
each candidate alone once, so it takes the larger of this and the spread its side-by-side processes measured
(``process_spread``): on a day the machine changes speed between processes, one cold run each is that noisy."""
PerProcess = dict[str, dict[int, list[float]]]


def compare(settings: Settings, run_dir: Path) -> Comparison:
    configs = settings.candidate_configs()
    texts = [label(t) for t in settings.compare.candidates]
    out = run_dir / "compare" / time.strftime("%Y%m%d-%H%M%S")
    started = time.time()
    cold: dict[str, TrialResult] = {}
    members = []
    for i, (text, config) in enumerate(zip(texts, configs, strict=True)):
        key = repr(sorted(config.flat().items()))
        if key not in cold:  # one cold run per distinct configuration (an A/A test runs one)
            log.info("cold run of candidate %d (%s): compile time, peak memory, program", i, text)
            cold[key] = launch(out / f"cold{i}", settings.trial_spec(config), cache_dir=settings.cache_dir)
        members.append(sidebyside.Member(f"{i}: {text}", config, cold[key]))
    failed = [m for m in members if not m.cold.ok]
    ok = [m for m in members if m.cold.ok]
    walls = {"cold_s": time.time() - started}
    method, why, per, cpu = "none", "fewer than two candidates ran", {}, {}
    if len(ok) >= 2:
        method, why, per, cpu = timed(ok, settings, out)
    walls["timed_s"] = time.time() - started - walls["cold_s"]
    report = summarise(members, failed, per, method, why, settings, walls, cpu)
    report.run_dir = str(out)
    write_json_atomic(run_dir / "compare.json", report.as_dict())
    write_json_atomic(out / "compare.json", report.as_dict())
    return report


def timed(members: list[sidebyside.Member], settings: Settings, out: Path
          ) -> tuple[str, str, PerProcess, PerProcess]:
    """Side by side when the members can share a process, else fresh-process rounds: (method, why, label
    -> process or round -> step times, and side by side their CPU seconds per step)."""
    reason = sidebyside.cannot_share(members, settings)  # a script's too: its agent switches candidates
    if reason is None:
        results: list[TrialResult] = []
        for p in range(settings.compare.decided_processes):
            results.append(sidebyside.run_process(out / f"process{p}", members, settings, shift=p))
            if (reason := sidebyside.not_shared(results)) is not None:
                break  # the rest would fail alike
        if reason is None:
            return SIDE_BY_SIDE, "", sidebyside.windows(results), sidebyside.windows(results, cpu=True)
    log.warning("fresh-process rounds instead of side by side: %s", reason)
    rounds: dict[str, dict[int, list[float]]] = {}
    for r in range(settings.compare.decided_processes):
        for k in range(len(members)):
            m = members[(k + r) % len(members)]  # each candidate opens a round in turn
            cache = Path(m.cold.trial_dir or "") / "inductor_cache"
            result = launch(out / f"round{r}" / m.label.split(":")[0], settings.trial_spec(m.config),
                            cache_dir=cache if cache.is_dir() else None)
            if result.ok and result.step_s is not None:
                rounds.setdefault(m.label, {})[r] = [result.step_s]
    return FRESH_PROCESSES, reason, rounds, {}


def pair(base: dict[int, list[float]], other: dict[int, list[float]], method: str,
         cpu_base: dict[int, list[float]] | None = None, cpu_other: dict[int, list[float]] | None = None
         ) -> Paired | None:
    """``other / base`` of step time: paired windows side by side (with their CPU seconds, which tell a
    descheduled window from the program's own slow one), else paired fresh-process rounds."""
    if method == SIDE_BY_SIDE:
        return paired_windows(base, other, cpu_base, cpu_other)
    return from_rounds(paired_ratio({r: v[0] for r, v in other.items()}, {r: v[0] for r, v in base.items()}))


def process_spread(per: PerProcess) -> tuple[float, int] | None:
    """The largest sd, over candidates, of a candidate's log median step time from one side-by-side process to
    the next (each process a fresh start, as a cold run alone is), with its degrees of freedom; None under three
    processes."""
    widest: tuple[float, int] | None = None
    for by_process in per.values():
        logs = [math.log(statistics.median(v)) for v in by_process.values() if v]
        if len(logs) >= 3 and (widest is None or statistics.stdev(logs) > widest[0]):
            widest = (statistics.stdev(logs), len(logs) - 1)
    return widest


def alone_disagrees(step: Paired, alone: tuple[float, float], names: tuple[str, str],
                    alone_cv: float = ALONE_CV, df: int | None = None) -> str | None:
    """One line when the side-by-side ratio ``step`` (``b / a``) and the ratio of the candidates' cold runs
    alone (``alone``: a's and b's step seconds) differ by more than their noise allows (95 %, each cold run
    one fresh process of log sd ``alone_cv``, estimated with ``df`` degrees of freedom or, None, a prior);
    None when they agree. The side-by-side ratio's own error enters with its degrees of freedom (with two
    processes it has one). Where the processes disagreed on the ratio (its interval made of the process means)
    and the cold runs' noise is the prior, which speaks of a process's speed and not of the ratio, the cold
    pair is read as one more process: its ratio's own process effect (``processes`` x the ratio's variance)
    joins, as in a prediction interval."""
    a, b = alone
    if not a or not b:
        return None
    apart = math.log(b / a) - math.log1p(step.change)
    ratio_var = step.log_se**2
    if df is None and step.basis == "process means":
        ratio_var *= step.processes + 1
    parts = [2 * alone_cv**2, ratio_var]
    half = t_quantile(satterthwaite(parts, [df or math.inf, step.df or math.inf])) * math.sqrt(sum(parts))
    if abs(apart) <= half:
        return None
    return (f"{names[1]}: side by side {step.text()}, but alone {b / a - 1:+.1%} (one cold run each; they "
            f"should agree within about +-{math.expm1(half):.0%}): a candidate's speed depends on its process, so "
            "neither ratio is the answer")


def alone_noise(per: PerProcess) -> tuple[float, int | None]:
    """The cold runs' noise for :func:`alone_disagrees`: the processes' own spread where it is above the prior."""
    spread = process_spread(per)
    return spread if spread is not None and spread[0] > ALONE_CV else (ALONE_CV, None)


def summarise(members: list[sidebyside.Member], failed: list[sidebyside.Member],
              per: dict[str, dict[int, list[float]]], method: str, why: str, settings: Settings,
              walls: dict[str, float], cpu: PerProcess | None = None) -> Comparison:
    env = settings.env
    cpu = cpu or {}
    rows = []
    for m in members:
        steps = per.get(m.label)
        rows.append(CompareRow(
            m.label, m.config.active(env), describe(m.config, env), m.cold.status, m.cold.reason,
            sidebyside.step_s(steps, cpu.get(m.label)) if steps else None, m.cold.step_s, m.cold.compile_s,
            m.cold.peak_memory_bytes, m.cold.fingerprint, m.cold.throughput_unit or "tokens", m.cold.trial_dir))
    pairs = []
    base = rows[0]
    alone_cv, alone_df = alone_noise(per)
    horizon = settings.objective.horizon_steps
    spread = prior_for(settings)  # one cold run per program: the prior alone, learned on this device
    for b, row in enumerate(rows[1:], start=1):
        a_steps, b_steps = per.get(base.label), per.get(row.label)
        step = pair(a_steps, b_steps, method, cpu.get(base.label), cpu.get(row.label)) \
            if a_steps and b_steps else None
        if step is None or base.step_s is None or row.step_s is None:
            continue
        a = (base.step_s, base.compile_s or 0.0)
        bb = (row.step_s, row.compile_s or 0.0)
        shared = base.cold_trial is not None and base.cold_trial == row.cold_trial  # A/A: alone is 1
        ttt = time_to_train(step, a, bb, horizon, spread.cv, spread.df, shared_cold=shared)
        pays = break_even(step, a, bb, (base.label, row.label))
        apart = None if shared or method != SIDE_BY_SIDE else alone_disagrees(
            step, (base.step_s_alone or 0.0, row.step_s_alone or 0.0), (base.label, row.label), alone_cv, alone_df)
        pairs.append(ComparePair(0, b, step, ttt, horizon, pays, apart is None,
                                 apart or verdict(step, row.label, base.label, pays)))
    changes = [c.text(label, f"process {p}") for label, p, c in sidebyside.speed_changes(per, cpu)] \
        if method == SIDE_BY_SIDE else []
    seen = set()
    for m in members:  # a cold run that changed speed: its alone step time blends two speeds
        cold = m.cold.step_s_windows or []
        if not m.cold.ok or m.cold.trial_dir in seen:
            continue
        seen.add(m.cold.trial_dir)
        if (c := change_point(cold, m.cold.step_cpu_s_windows)) is not None:
            changes.append(c.text(m.label, "its cold run alone"))
    model = ("log window step time = candidate + process effect + window noise; windows paired within rounds, "
             "a random effect per process (see docs/measuring.md)") if method == SIDE_BY_SIDE else \
        "one fresh process per candidate and round, paired by round"
    return Comparison(method, why, settings.compare.decided_processes, model, rows, pairs, alone_cv, walls, changes,
                      [Failed(m.label, m.cold.reason) for m in failed])


def verdict(step: Paired, b: str, a: str, pays: str | None) -> str:
    """In words, for a user deciding between ``a`` and ``b``."""
    if step.low is None or step.high is None:
        return f"{b}: one measurement only, no interval"
    if not step.measurable:
        return f"{b} vs {a}: no measurable difference in step time ({step.text()})"
    faster = step.change < 0
    text = f"{b}: steps measurably {'faster' if faster else 'slower'} than {a} ({step.text()})"
    return text + (f"; {pays}" if pays else "")
