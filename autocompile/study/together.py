"""The phases side by side: each round is one fresh process timing every candidate in rotating windows.

One Optuna trial per candidate and round (user attributes ``phase``, ``round``, ``label``, and
``method`` = ``side_by_side``), told with the candidate's step time in that process (the geometric
mean of its windows) and its windows in ``result.step_s_windows``: :mod:`autocompile.study.racing`
pairs them window by window. The value told to Optuna uses the candidate's cold compile time.

Verdict neighbours first run once alone and cold (round -1, ``cold_run``): their compile time, peak
memory and program (one that compiles the winner's very program stops there: "identical program"),
then the winner and the remaining neighbours share the rounds.

Which method a phase used is a study attribute (``method.<phase>``): side by side unless it was
turned off (``study.side_by_side=false``), the candidates cannot share a process
(:func:`sidebyside.cannot_share`), or a candidate failed beside the others in the first round; then
the phase runs in fresh-process rounds and the report says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autocompile.config.knobs import describe
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace, identity
from autocompile.study import sidebyside
from autocompile.study.objective import Objective
from autocompile.study.shared import heartbeat, tell
from autocompile.trial.reference import reference
from autocompile.trial.warmstart import TRIAL_FILE

log = logging.getLogger(__name__)

MeasureTogether = Callable[[list[optuna.Trial]], None]


def method(study: optuna.Study, phase: str) -> dict[str, str]:
    """How ``phase`` timed its candidates: ``{"method": "side_by_side" | "fresh_processes", "why": ...}``."""
    return study.user_attrs.get(f"method.{phase}") or {"method": "fresh_processes", "why": "recorded before side "
                                                                                          "by side existed"}


def set_method(study: optuna.Study, phase: str, name: str, why: str = "") -> None:
    study.set_user_attr(f"method.{phase}", {"method": name, "why": why})
    if name != "side_by_side":
        log.warning("%s phase: fresh-process rounds instead of side by side: %s", phase, why)


def cold_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """What a member needs of its cold single-candidate run: program, artifacts, peak memory, compile time."""
    result = dict(trial.user_attrs.get("result") or {})
    result["trial_dir"] = trial.user_attrs.get("trial_dir")
    artifacts = Path(trial.user_attrs.get("trial_dir", "")) / TRIAL_FILE
    if artifacts.is_file():
        result["compile_artifacts"] = {"path": str(artifacts)}
    return result


def failure(candidate: dict[str, Any], result: dict[str, Any], shared: str | None) -> dict[str, Any] | None:
    """Why a candidate of a side-by-side process has no step time (``failure``, ``reason``), or None: it failed,
    the process failed, or it was ready but every other candidate failed beside it, so no round had two
    candidates to time (its ``step_s`` is None)."""
    if candidate.get("status") == "ok" and result.get("status") == "ok":
        if candidate.get("step_s") is not None:
            return None
        return {"failure": "not_timed", "reason": f"not timed: no other candidate was left beside it ({shared})"}
    return {"failure": candidate.get("failure") or result.get("failure"),
            "reason": candidate.get("reason") or result.get("reason", "")}


def process_dir(run_dir: Path, phase: str, r: int) -> Path:
    """Where round ``r`` of a side-by-side phase runs (its spec, logs, progress and result)."""
    return run_dir / "phases" / f"{phase}-round{r}"


def measure_together(study: optuna.Study, trials: list[optuna.Trial], space: SearchSpace, objective: Objective,
                     settings: Settings, run_dir: Path, resources: Any, agents: Any) -> str | None:
    """One side-by-side process timing ``trials`` (the candidates of one round); each told alone. Returns
    why they could not share the process (a candidate failed beside the others), or None."""
    r = trials[0].user_attrs["round"]
    phase = trials[0].user_attrs["phase"]
    out = process_dir(run_dir, phase, r)
    members = []
    beats = []
    for trial in trials:
        config = space.sample(trial)
        trial.set_user_attr("config", config.active(space.env))
        trial.set_user_attr("identity", identity(config, space.env))
        trial.set_user_attr("name", describe(config, space.env))
        trial.set_user_attr("trial_dir", str(out))
        trial.set_user_attr("method", "side_by_side")
        trial.set_user_attr("compile_cache", "side by side: warm from its cold run's artifacts")
        beats.append(heartbeat(study, trial))
        cold = study.trials[trial.user_attrs["cold_trial"]]
        members.append(sidebyside.Member(trial.user_attrs["label"], config, cold_of(cold)))
    for beat in beats:
        beat()
    log.info("%s round %d side by side: %s", phase, r, ", ".join(m.label for m in members))
    result = sidebyside.run_process(out, members, settings, shift=r, resources=resources, agents=agents)
    shared = sidebyside.not_shared([result])
    ref = reference(study)
    for trial, member, c in zip(trials, members, result.get("candidates") or [{}] * len(trials), strict=True):
        failed = failure(c, result, shared)
        if failed is not None:
            trial.set_user_attr("result", {"status": "failed", **failed})
            trial.set_user_attr("reason", failed["reason"])
            tell(study, trial, TrialState.FAIL, None, None)
            continue
        cold = member.cold
        items_per_step = cold["tokens_per_s"] * cold["step_s"]  # a step's tokens (or samples), as measured alone
        measured = {"status": "ok", "step_s": c["step_s"], "step_s_windows": c["step_s_windows"],
                    "tokens_per_s": items_per_step / c["step_s"],
                    "losses": c["losses"], "fingerprint": c["fingerprint"], "compiled": c["compiled"],
                    "compiled_coverage": c.get("coverage"), "throughput_unit": result.get("throughput_unit"),
                    "compile_s": cold["compile_s"], "peak_memory_bytes": cold.get("peak_memory_bytes"),
                    "wall_s": result.get("wall_s"), "side_by_side": {"round": r, "rounds": result["rounds"],
                                                                     "window_steps": result["window_steps"]}}
        trial.set_user_attr("result", measured)
        constraints = objective.constraints(measured, ref["losses"] if ref else None)
        trial.set_user_attr("constraints", constraints)
        tell(study, trial, TrialState.COMPLETE, objective.values(measured), constraints)
    return shared
