"""One trial as an MLflow child run: its tags (state, phase, fingerprint, reason, the Markdown note the UI
shows) and its metrics (the measurement, its histories, time to train, speedups over the baselines); and the
keys of the workload params every run carries and of the tags the study's parent run ends with."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TypedDict

from optuna.trial import FrozenTrial

from autocompile.config.gpus import gpu_name
from autocompile.study.answers import ANSWER_FILE, ANSWER_TAG, KEY_TAG, RELATED_TAG, Answer
from autocompile.study.records.objective import time_to_train
from autocompile.study.records.record import Measurement, TrialRecord
from autocompile.trial.launcher import read_progress
from autocompile.trial.timing.result import Environment

STUDY_TAG = "autocompile.study"
MAX_TAG_CHARS = 8000
"""MLflow's longest tag value (``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``)."""
TRIAL_TAG = "optuna.trial_number"
METRICS = ("tokens_per_s", "step_s", "step_s_cv", "compile_s", "first_step_s", "mfu", "graph_count",
           "graph_breaks", "recompiles_timed", "wall_s", "compiled_coverage")
WARM_KEYS = ("compile_s", "first_step_s")
"""Measured after a warm cache in a repeat: logged as ``compile_s_warm``..., never beside cold compiles."""
RECORD_TAGS = ("baseline", "duplicate_of", "retry_of", "round", "label", "compile_cache", "same_program_as",
               "numerics")
"""Record fields that become ``autocompile.<field>`` tags when set."""

WorkloadParams = TypedDict("WorkloadParams", {
    "model": str, "workload.batch_size": int, "workload.seq_len": str, "workload.world_size": int,
    "workload.device": str, "objective.kind": str})
"""The params of the parent and of every child run that say which workload it measured."""
ChildTagsAlways = TypedDict("ChildTagsAlways", {
    "optuna.trial_number": int, "autocompile.study": str, "optuna.state": str, "status": str, "torch": str,
    "device_name": str, "world_size": int, "autocompile.phase": str, "mlflow.note.content": str})
ChildTagsWhenSet = TypedDict("ChildTagsWhenSet", {
    "autocompile.fingerprint": str, "autocompile.baseline": str, "autocompile.duplicate_of": int,
    "autocompile.retry_of": int, "autocompile.round": int, "autocompile.label": str, "autocompile.compile_cache": str,
    "autocompile.same_program_as": int, "autocompile.numerics": str, "reason": str, "failure": str,
    "mlflow.parentRunId": str}, total=False)
"""The record's fields of :data:`RECORD_TAGS` that are set, and the parent run's id (set by the tracker)."""


class ChildTags(ChildTagsAlways, ChildTagsWhenSet):
    """A child run's tags (:func:`child_tags`)."""


ParentTags = TypedDict("ParentTags", {
    "stop_reason": str, "mlflow.note.content": str, "best_trial": int, "best_config": str, "best_run_id": str,
    "confirmed_trial": int, "confirmed_config": str, "confirmed_conclusion": str, "autocompile.answer_key": str,
    "autocompile.answer_related": str, "autocompile.answer": str}, total=False)
"""The tags the study's parent run ends with: ``stop_reason`` and the note always, ``best_*`` when a trial
completed, ``confirmed_*`` when the confirmation found a winner, ``autocompile.answer*`` when it recommends one (what
a later study of the same job finds by key, :mod:`autocompile.study.answers`)."""


def answer_tags(run_dir: Path) -> ParentTags:
    """The study's answer (its ``answer.json``) as tags a search by key finds; none when it has none."""
    path = run_dir / ANSWER_FILE
    if not path.is_file():
        return {}
    answer = Answer.from_json(path.read_text(), str(path))
    return {KEY_TAG: answer.key, RELATED_TAG: answer.related, ANSWER_TAG: answer.to_json(MAX_TAG_CHARS)}


def local_environment(device: str) -> Environment:
    """torch and device as the tuner sees them: for trials that ended before the worker reported its own."""
    import torch

    name = platform.processor() or platform.machine()
    if device == "cuda" and torch.cuda.is_available():
        name = gpu_name()  # without a CUDA context in the tuner (config/gpus.py)
    return {"torch": torch.__version__, "device_name": name}


def child_tags(trial: FrozenTrial, record: TrialRecord, env: Environment, study_name: str,
               world_size: int) -> ChildTags:
    """The run's tags: Optuna's state and number, the record's phase and fields, reason, failure, note."""
    result = record.measured
    status = result.status or trial.state.name.lower()
    tags: ChildTags = {TRIAL_TAG: trial.number, STUDY_TAG: study_name, "optuna.state": trial.state.name,
                       "status": status, "torch": env.get("torch", ""), "device_name": env.get("device_name", ""),
                       "world_size": env.get("world_size", world_size), "autocompile.phase": record.phase}
    if result.fingerprint:
        tags["autocompile.fingerprint"] = result.fingerprint  # equal tags: the same compiled program
    tags |= {f"autocompile.{key}": getattr(record, key) for key in RECORD_TAGS if getattr(record, key) is not None}
    reason = record.reason or result.reason or ""
    if reason:
        tags["reason"] = reason[:5000]
    if result.failure:
        tags["failure"] = result.failure
    trial_dir = Path(record.trial_dir) if record.trial_dir else None
    tags["mlflow.note.content"] = note(trial, record, status, reason, result, trial_dir)
    return tags


def child_metrics(trial: FrozenTrial, record: TrialRecord, horizon_steps: int,
                  speedups: dict[str, float]) -> list[tuple[str, float, int]]:
    """(key, value, step): the measurement's numbers (a repeat's warm compile under ``*_warm``), the objective,
    time to train and speedups, and the histories (losses, windows, warm-up steps from the progress events)."""
    result = record.measured
    numbers = result.to_dict()  # MLflow's metric keys are the measurement's field names
    warm = record.warm_repeat
    if warm:  # compile_s is always a cold compile: the warm one of a repeat gets a key of its own
        numbers |= {f"{k}_warm": numbers.pop(k) for k in WARM_KEYS if k in numbers}
        if record.compile_s_cold is not None:
            numbers["compile_s"] = record.compile_s_cold  # its configuration's cold run, as Optuna's value
    metrics = [(k, numbers[k], 0) for k in (*METRICS, *(f"{k}_warm" for k in WARM_KEYS))
               if isinstance(numbers.get(k), (int, float))]
    if result.peak_memory_bytes is not None:
        metrics.append(("peak_memory_mb", result.peak_memory_bytes / 2**20, 0))
    for i, v in enumerate(trial.values or []):
        metrics.append((f"objective_{i}" if len(trial.values) > 1 else "objective", v, 0))
    if result.ok and "step_s" in numbers and "compile_s" in numbers:
        metrics.append(("time_to_train_s", time_to_train(numbers["compile_s"], numbers["step_s"], horizon_steps), 0))
        metrics += [(f"speedup_vs_{name}", value, 0) for name, value in speedups.items()]
    metrics += [("loss", v, i) for i, v in enumerate(result.losses or [])]
    metrics += [("tokens_per_s_window", v, i) for i, v in enumerate(result.tokens_per_s_windows or [])]
    if record.trial_dir and record.duplicate_of is None:
        # What the worker reported while it ran: the story of a pruned trial (how far it got).
        events = read_progress(Path(record.trial_dir))
        metrics += [("warmup_step_s_warm" if warm else "warmup_step_s", e["seconds"], e["step"])
                    for e in events if e["event"] == "warmup_step"]
        metrics += [("step_s_window", e["step_s"], e["window"]) for e in events if e["event"] == "window"]
    return metrics


def note(trial: FrozenTrial, record: TrialRecord, status: str, reason: str, result: Measurement,
         trial_dir: Path | None) -> str:
    """The run's description in the UI (Markdown): outcome and reason first, then how to replay it."""
    lines = [f"**Trial {trial.number}: {status}**" + (f" — {reason}" if reason else "")]
    if status == "ok" and result.tokens_per_s is not None:
        lines.append(f"{result.tokens_per_s:,.0f} {result.unit}/s, {result.step_s * 1e3:.2f} ms/step, "
                     f"compile {result.compile_s:.1f} s"
                     + (" from a warm cache (`compile_s_warm`; `compile_s` is its cold run's)"
                        if record.warm_repeat else ""))
    config = record.config
    lines.append("Configuration: `" + (", ".join(f"{k}={v}" for k, v in config.items()) or "defaults") + "`")
    cmd = trial_dir / "cmd.txt" if trial_dir is not None else None
    if cmd is not None and cmd.is_file():
        lines.append("Replay (artifact `trial/cmd.txt`):\n\n```\n" + cmd.read_text().splitlines()[0] + "\n```")
    return "\n\n".join(lines)[:20000]
