"""The phases side by side: each round is one fresh process timing every candidate in rotating windows.

One Optuna trial per candidate and round (user attributes ``phase``, ``round``, ``label``, and
``method`` = ``side_by_side``), told with the candidate's step time in that process (the geometric
mean of its windows) and its windows in ``result.step_s_windows``: :mod:`autocompile.study.phases.racing`
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

import optuna

from autocompile.config.choices import SIDE_BY_SIDE
from autocompile.config.sections import Resources
from autocompile.study.phases import sidebyside
from autocompile.study.records.context import StudyContext
from autocompile.study.records.record import Measurement, TrialRecord, set_attrs
from autocompile.study.search.tell import begin, tell_measured
from autocompile.trial.timing.compile_artifacts import TRIAL_FILE
from autocompile.trial.timing.result import TrialResult

log = logging.getLogger(__name__)

MeasureTogether = Callable[[list[optuna.Trial]], None]


def cold_of(trial: optuna.trial.FrozenTrial) -> TrialResult:
    """What a member needs of its cold single-candidate run: program, artifacts, peak memory, compile time."""
    record = TrialRecord.of(trial)
    result = TrialResult.from_json(record.measured.to_dict())
    result.trial_dir = record.trial_dir
    artifacts = Path(record.trial_dir or "") / TRIAL_FILE
    if artifacts.is_file():
        result.compile_artifacts = {"path": str(artifacts)}
    return result


def failure(candidate: TrialResult, result: TrialResult, shared: str | None) -> Measurement | None:
    """Why a candidate of a side-by-side process has no step time (a failed measurement), or None: it failed,
    the process failed, or it was ready but every other candidate failed beside it, so no round had two
    candidates to time (its ``step_s`` is None)."""
    if candidate.ok and result.ok:
        if candidate.step_s is not None:
            return None
        return Measurement(status="failed", failure="not_timed",
                           reason=f"not timed: no other candidate was left beside it ({shared})")
    return Measurement(status="failed", failure=candidate.failure or result.failure,
                       reason=candidate.reason or result.reason or "")


def process_dir(run_dir: Path, phase: str, r: int) -> Path:
    """Where round ``r`` of a side-by-side phase runs (its spec, logs, progress and result)."""
    return run_dir / "phases" / f"{phase}-round{r}"


def measure_together(ctx: StudyContext, trials: list[optuna.Trial], resources: Resources) -> str | None:
    """One side-by-side process timing ``trials`` (the candidates of one round); each told alone. Returns
    why they could not share the process (a candidate failed beside the others), or None."""
    study, objective, settings = ctx.study, ctx.objective, ctx.settings
    first = TrialRecord.of(trials[0])
    r, phase = first.round, first.phase
    out = process_dir(ctx.run_dir, phase, r)
    members, beats = [], []
    for trial in trials:
        config, beat = begin(study, trial, ctx.space)
        beats.append(beat)
        set_attrs(trial, trial_dir=str(out), method=SIDE_BY_SIDE,
                  compile_cache="side by side: warm from its cold run's artifacts")
        record = TrialRecord.of(trial)
        members.append(sidebyside.Member(record.label, config, cold_of(study.trials[record.cold_trial])))
    log.info("%s round %d side by side: %s", phase, r, ", ".join(m.label for m in members))

    def beat_all() -> None:  # every candidate's trial is RUNNING while the one process times them all
        for beat in beats:
            beat()

    result = sidebyside.run_process(out, members, settings, shift=r, resources=resources, agents=ctx.agents,
                                    beat=beat_all)
    shared = sidebyside.not_shared([result])
    script_study = settings.script.given
    outcomes = result.candidates or [TrialResult(status="failed")] * len(trials)
    for trial, member, c in zip(trials, members, outcomes, strict=True):
        failed = failure(c, result, shared)
        if failed is not None or c.step_s is None:
            tell_measured(study, trial, objective, failed or Measurement(status="failed"))
            continue
        cold = Measurement.of(member.cold)
        items_per_step = cold.tokens_per_s * cold.step_s  # a step's tokens (or samples), as measured alone
        # A script's candidates take turns on one model and one loop: their losses there continue each other's
        # training, so the numerics are their cold runs' (the same program: the fingerprint check says so).
        losses = cold.losses if script_study else c.losses
        tell_measured(study, trial, objective, Measurement(
            status="ok", step_s=c.step_s, step_s_windows=c.step_s_windows, step_cpu_s_windows=c.step_cpu_s_windows,
            tokens_per_s=items_per_step / c.step_s, losses=losses, fingerprint=c.fingerprint,
            compiled=c.compiled, compiled_coverage=c.compiled_coverage, throughput_unit=result.throughput_unit,
            compile_s=cold.compile_s, peak_memory_bytes=cold.peak_memory_bytes, wall_s=result.wall_s,
            side_by_side={"round": r, "rounds": result.rounds or 0, "window_steps": result.window_steps or 0}))
    return shared
