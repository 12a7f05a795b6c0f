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

A script (``script.path``) always runs fresh-process rounds: each of its processes runs one configuration.
Candidates that cannot share a process (:func:`sidebyside.cannot_share`, or one that failed beside the
others) are compared in fresh-process rounds instead (one process per candidate and round, paired
by round), and the output says which ran and why.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from autocompile.config.comparing import label
from autocompile.config.knobs import describe
from autocompile.config.settings import Settings
from autocompile.config.spec import write_json_atomic
from autocompile.study import sidebyside
from autocompile.study.intervals import Paired, break_even, paired_windows, t_quantile, time_to_train
from autocompile.trial.launcher import launch
from autocompile.trial.stats import paired_ratio

log = logging.getLogger(__name__)
SCRIPT_ROUNDS = "a script's process runs one configuration (its own loop holds the model): fresh-process rounds"


def compare(settings: Settings, run_dir: Path) -> dict[str, Any]:
    configs = settings.candidate_configs()
    texts = [label(t) for t in settings.compare.candidates]
    out = run_dir / "compare" / time.strftime("%Y%m%d-%H%M%S")
    started = time.time()
    cold: dict[str, dict[str, Any]] = {}
    members = []
    for i, (text, config) in enumerate(zip(texts, configs, strict=True)):
        key = repr(sorted(config.flat().items()))
        if key not in cold:  # one cold run per distinct configuration (an A/A test runs one)
            log.info("cold run of candidate %d (%s): compile time, peak memory, program", i, text)
            cold[key] = launch(out / f"cold{i}", settings.trial_spec(config), cache_dir=settings.cache_dir)
        members.append(sidebyside.Member(f"{i}: {text}", config, cold[key]))
    failed = [m for m in members if m.cold.get("status") != "ok"]
    ok = [m for m in members if m.cold.get("status") == "ok"]
    walls = {"cold_s": time.time() - started}
    method, why, per = "none", "fewer than two candidates ran", {}
    if len(ok) >= 2:
        method, why, per = timed(ok, settings, out)
    walls["timed_s"] = time.time() - started - walls["cold_s"]
    report = summarise(members, failed, per, method, why, settings, walls)
    report["run_dir"] = str(out)
    write_json_atomic(run_dir / "compare.json", report)
    write_json_atomic(out / "compare.json", report)
    return report


def timed(members: list[sidebyside.Member], settings: Settings, out: Path
          ) -> tuple[str, str, dict[str, dict[int, list[float]]]]:
    """Side by side when the members can share a process, else fresh-process rounds: (method, why, label
    -> process or round -> step times)."""
    reason = SCRIPT_ROUNDS if settings.script.given else sidebyside.cannot_share(members, settings)
    if reason is None:
        results: list[dict[str, Any]] = []
        for p in range(settings.compare.processes):
            results.append(sidebyside.run_process(out / f"process{p}", members, settings, shift=p))
            if (reason := sidebyside.not_shared(results)) is not None:
                break  # the rest would fail alike
        if reason is None:
            return "side_by_side", "", sidebyside.windows(results)
    log.warning("fresh-process rounds instead of side by side: %s", reason)
    rounds: dict[str, dict[int, list[float]]] = {}
    for r in range(settings.compare.processes):
        for k in range(len(members)):
            m = members[(k + r) % len(members)]  # each candidate opens a round in turn
            cache = Path(m.cold["trial_dir"]) / "inductor_cache"
            result = launch(out / f"round{r}" / m.label.split(":")[0], settings.trial_spec(m.config),
                            cache_dir=cache if cache.is_dir() else None)
            if result.get("status") == "ok":
                rounds.setdefault(m.label, {})[r] = [result["step_s"]]
    return "fresh_processes", reason, rounds


def pair(base: dict[int, list[float]], other: dict[int, list[float]], method: str) -> Paired | None:
    """``other / base`` of step time: paired windows side by side, else paired fresh-process rounds."""
    if method == "side_by_side":
        return paired_windows(base, other)
    ratio = paired_ratio({r: v[0] for r, v in other.items()}, {r: v[0] for r, v in base.items()})
    if ratio is None:
        return None
    df = ratio.rounds - 1
    se = (math.log1p(ratio.high) - math.log1p(ratio.change)) / t_quantile(df) if ratio.high is not None else 0.0
    return Paired(ratio.change, ratio.low, ratio.high, ratio.rounds, ratio.rounds, "fresh-process rounds", None,
                  se, df)


def summarise(members: list[sidebyside.Member], failed: list[sidebyside.Member],
              per: dict[str, dict[int, list[float]]], method: str, why: str, settings: Settings,
              walls: dict[str, float]) -> dict[str, Any]:
    env = settings.env
    rows = []
    for m in members:
        steps = per.get(m.label)
        rows.append({"label": m.label, "knobs": m.config.active(env), "name": describe(m.config, env),
                     "status": m.cold.get("status"), "reason": m.cold.get("reason"),
                     "step_s": sidebyside.step_s(steps) if steps else None,
                     "step_s_alone": m.cold.get("step_s"), "compile_s": m.cold.get("compile_s"),
                     "peak_memory_bytes": m.cold.get("peak_memory_bytes"), "fingerprint": m.cold.get("fingerprint"),
                     "throughput_unit": m.cold.get("throughput_unit", "tokens"), "cold_trial": m.cold.get("trial_dir")})
    pairs = []
    base = rows[0]
    horizon = settings.objective.horizon_steps
    for b, row in enumerate(rows[1:], start=1):
        a_steps, b_steps = per.get(base["label"]), per.get(row["label"])
        step = pair(a_steps, b_steps, method) if a_steps and b_steps else None
        if step is None:
            continue
        a = (base["step_s"], base["compile_s"] or 0.0)
        bb = (row["step_s"], row["compile_s"] or 0.0)
        ttt = time_to_train(step, a, bb, horizon, settings.objective.compile_cv, settings.objective.compile_df,
                            shared_cold=base["cold_trial"] is not None and base["cold_trial"] == row["cold_trial"])
        pays = break_even(step, a, bb, (base["label"], row["label"]))
        pairs.append({"a": 0, "b": b, "change": step.change, "low": step.low, "high": step.high,
                      "measurable": step.measurable, "step": step.as_dict(), "time_to_train": ttt.as_dict(),
                      "horizon_steps": horizon, "break_even": pays, "verdict": verdict(step, row["label"],
                                                                                         base["label"], pays)})
    return {"method": method, "why": why, "processes": settings.compare.processes,
            "model": ("log window step time = candidate + process effect + window noise; windows paired within "
                      "rounds, a random effect per process (see docs/measuring.md)") if method == "side_by_side" else
            "one fresh process per candidate and round, paired by round",
            "candidates": rows, "pairs": pairs, "wall_s": walls,
            "failed": [{"label": m.label, "reason": m.cold.get("reason")} for m in failed]}


def verdict(step: Paired, b: str, a: str, pays: str | None) -> str:
    """In words, for a user deciding between ``a`` and ``b``."""
    if step.low is None or step.high is None:
        return f"{b}: one measurement only, no interval"
    if not step.measurable:
        return f"{b} vs {a}: no measurable difference in step time ({step.text()})"
    faster = step.change < 0
    text = f"{b}: steps measurably {'faster' if faster else 'slower'} than {a} ({step.text()})"
    return text + (f"; {pays}" if pays else "")
