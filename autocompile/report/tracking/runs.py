"""MLflow tracking: one parent run per study, one run per trial nested by configuration, comparable in the MLflow UI.

Only the tuner writes to MLflow (workers write files). The store defaults to SQLite next to the
run directories (``<output_root>/mlflow.db``, artifacts in ``<output_root>/mlartifacts``), so
studies accumulate side by side; ``tracking.uri=http://...`` logs to a running server instead.

Shapes, chosen for the UI's compare views (parallel coordinates, scatter, contour, box), which
plot the params and metrics that the selected runs share:

- one experiment per model (``tracking.experiment`` overrides), so the studies of one model,
  including every job of a Hydra multirun, are side by side; the workload is a param of each run;
- one parent run per study, named after it; a resumed study continues under the same parent
  (its id is kept in the Optuna study) and never logs a trial twice; tuners started together make
  it one at a time (a lock in the run directory; a fresh SQLite store is created under a lock too);
- one run per finished trial, the parent's direct children one per configuration, its other trials (repeats,
  duplicates, retries) nested under it (:mod:`autocompile.report.tracking.nesting`), named ``#N`` plus the
  knobs that differ from their defaults (fixed knobs left out: they are the same in every trial).
  Params: every knob under its dotted key (``n/a`` where it does not apply), plus the workload.
  Metrics: the measurement, the objective, the speedup over each baseline, and histories (loss
  per step, throughput per window, warm-up step times). Tags and the run's note: Optuna number
  and state, failure or prune reason, torch, device, world size. FAILED / KILLED for failed /
  pruned trials. Artifacts: the trial's files (config, result, command, logs).

The parent gets the resolved config, the summary, the best configuration (YAML and code), the
trials and verdict tables and the plots (:mod:`autocompile.report.tracking.plots`). Every write is batched: over
HTTP one call per metric is slow.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.knobs import KNOBS
from autocompile.config.settings import Settings
from autocompile.config.spec import PARTS
from autocompile.report.tracking.child_run import (
    STUDY_TAG,
    TRIAL_TAG,
    ParentTags,
    WorkloadParams,
    answer_tags,
    child_metrics,
    child_tags,
    local_environment,
)
from autocompile.report.tracking.mlflow_store import artifact_location, open_client
from autocompile.report.tracking.nesting import PARENT_TAG, identities, parent_for, regroup, tree
from autocompile.report.tracking.parent_summary import parent_summary
from autocompile.study.records.optuna_store import file_lock, is_orphaned, journal_file, owner, pid_namespace
from autocompile.study.records.record import Measurement, TrialRecord
from autocompile.trial.timing.result import Environment

log = logging.getLogger(__name__)

PARENT_ATTR = "mlflow_parent_run_id"
TRIAL_FILES = ("trial.json", "result.json", "cmd.txt", "stdout.log", "stderr.log", "progress.jsonl")
RUN_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.FAIL: "FAILED", TrialState.PRUNED: "KILLED"}
INACTIVE = "n/a"
"""Param value of a knob that does not apply to the trial (e.g. compile.mode of an eager trial)."""
PARENT_FILES = ("summary.json", "best_config.yaml", "best_config.py")
PARENT_LOCK = ".mlflow-parent.lock"
"""In the run directory: the study's tuners on this machine create its parent run, and place its runs at the end,
one at a time."""
LOG_GRACE_S = 600
"""A trial another live tuner finished is left to it for this long (it logs its own trials)."""


def experiment_name(settings: Settings) -> str:
    """One experiment per model: its studies (workloads, multirun jobs) side by side."""
    return settings.tracking.experiment or f"autocompile/{settings.model.name}"


def resolved_config(text: str) -> str:
    """The composed config with interpolations (the study name...) resolved, when they resolve here."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_yaml(OmegaConf.create(text), resolve=True)
    except Exception:  # noqa: BLE001 - resolvers not registered in this process: the raw config still says it all
        return text


def logged_elsewhere(trial: FrozenTrial) -> bool:
    """Another live tuner process ran this trial (tuners sharing a study) and logs it itself."""
    who = TrialRecord.of(trial).owner
    if not who or who == owner() or is_orphaned(trial):
        return False
    if who.get("host") == socket.gethostname() and who.get("pidns", pid_namespace()) == pid_namespace():
        return True  # its pid is alive
    done = trial.datetime_complete
    return done is None or (datetime.now() - done).total_seconds() < LOG_GRACE_S


def public_url(url: str) -> str:
    """A storage URL fit for a tag: without its password."""
    return re.sub(r"(://[^/:@]+):[^/@]*@", r"\1:***@", url)


class NoTracker:
    """``tracking.enabled=false``."""

    def log_trial(self, trial: FrozenTrial) -> None:
        pass

    def finish(self, report: Any, run_dir: Path) -> None:
        pass

    def abandon(self, why: str) -> None:
        pass


class MlflowTracker:
    def __init__(self, settings: Settings, study: optuna.Study, run_dir: Path) -> None:
        self.settings = settings
        self.study = study
        self.uri = settings.tracking_uri
        self.client = open_client(self.uri)
        self._environment: Environment | None = None
        # Tuners of one study started together would each find no parent and make one: one at a time,
        # the first makes it and records it in the study, the others find it there.
        with file_lock(run_dir / PARENT_LOCK):
            self.parent_id, self.experiment_id = self._parent_run(run_dir)
        self.placed: dict[int, str] = {}  # trial number -> the run its run hangs under (parent or configuration)
        self.children = self._children()
        # Trials finished before this tuner started (a resume, or another tuner process) are logged now.
        self.sync()

    # -- the study's parent run ---------------------------------------------------------------------

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        name = experiment_name(self.settings)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifact_location(self.uri, name))
            except MlflowException:  # another study of this model made it meanwhile (a parallel sweep)
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            self.client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    def _parent_run(self, run_dir: Path) -> tuple[str, str]:
        from mlflow.exceptions import MlflowException

        parent = self.study.user_attrs.get(PARENT_ATTR)
        if parent:
            try:
                run = self.client.get_run(parent)
            except MlflowException:
                run = None
            if run is not None and run.info.lifecycle_stage == "active":
                self.client.update_run(parent, status="RUNNING")
                return parent, run.info.experiment_id
            log.info("MLflow: the study's parent run %s is not in %s; starting a new one", parent, self.uri)
        experiment_id = self._experiment()
        s, w = self.settings, self.settings.workload
        journal = journal_file(s.study.storage, run_dir)
        run = self.client.create_run(experiment_id, run_name=self.study.study_name, tags={
            STUDY_TAG: self.study.study_name, "autocompile.run_dir": str(run_dir.resolve()),
            "autocompile.storage": str(journal) if journal is not None else public_url(s.study.storage),
            "mlflow.note.content": f"autocompile study `{self.study.study_name}`: {s.model.name}, objective "
                                  f"{s.objective.kind}. Its trials are the child runs; the summary, tables and "
                                  "plots are this run's artifacts.",
        })
        params = {**self.workload_params(), "objective.horizon_steps": s.objective.horizon_steps,
                  **{f"workload.{k}": json.dumps(getattr(w, k))[:500] for k in PARTS},
                  "workload.grad_clip_norm": w.grad_clip_norm, "workload.grad_accum_steps": w.grad_accum_steps,
                  "study.seed": s.study.seed, "study.extended": s.study.extended,
                  **{f"fixed.{k}": v for k, v in s.fixed_knobs.items()}}
        self._batch(run.info.run_id, params=params)
        self.study.set_user_attr(PARENT_ATTR, run.info.run_id)
        return run.info.run_id, experiment_id

    def workload_params(self) -> WorkloadParams:
        s, w = self.settings, self.settings.workload
        return {"model": s.model.name, "workload.batch_size": w.batch_size,
                "workload.seq_len": ",".join(map(str, w.seq_len)), "workload.world_size": w.world_size,
                "workload.device": s.device, "objective.kind": s.objective.kind}

    def _children(self) -> dict[int, tuple[str, set[str]]]:
        """Trial number -> (run id, metric keys) of the runs under this parent, nested ones too (and where each
        hangs, in ``placed``). A run left RUNNING was cut off while being logged: it is deleted and logged
        again, and so is a second run of one trial."""
        children: dict[int, tuple[str, set[str]]] = {}
        self.placed = {}
        trials = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        for run in tree(self.client, self.experiment_id, self.study.study_name, self.parent_id):
            number = run.data.tags.get(TRIAL_TAG)
            if number is None:
                continue
            if run.info.status == "RUNNING" or int(number) in children:
                trial = trials.get(int(number))
                if trial is None or not logged_elsewhere(trial):  # else its live tuner is logging it now
                    self.client.delete_run(run.info.run_id)
                continue
            children[int(number)] = (run.info.run_id, set(run.data.metrics))
            self.placed[int(number)] = run.data.tags.get(PARENT_TAG, "")
        return children

    def sync(self) -> None:
        """Log every finished trial that has no child run yet, except those another live tuner logs."""
        for trial in self.study.get_trials(deepcopy=False, states=tuple(RUN_STATUS)):
            if not logged_elsewhere(trial):
                self.log_trial(trial)
        runs = {number: run_id for number, (run_id, _) in self.children.items()}
        regroup(self.client, identities(self.study.get_trials(deepcopy=False)), runs, self.placed, self.parent_id)

    def converge(self) -> None:
        """Tuners on several machines (no shared run directory, so no shared lock) that started a fresh
        study together may each have made a parent; the one the study recorded last wins: the others
        move their direct children under it (nested runs follow their configuration's run) and delete their own."""
        winner = self.study.user_attrs.get(PARENT_ATTR)
        if not winner or winner == self.parent_id:
            return
        for number, (run_id, _) in self.children.items():
            if self.placed.get(number) == self.parent_id:
                self.client.set_tag(run_id, PARENT_TAG, winner)
        self.client.delete_run(self.parent_id)
        self.parent_id = winner
        self.children = self._children()

    # -- one child run per trial -----------------------------------------------------------------------

    def _batch(self, run_id: str, metrics: list[tuple[str, float, int]] = (), params: dict[str, Any] | None = None,
               tags: ParentTags | None = None, timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = timestamp_ms or int(time.time() * 1000)
        ms = [Metric(k, float(v), now, step) for k, v, step in metrics]
        ps = [Param(k, str(v)) for k, v in (params or {}).items()]
        ts = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        for i in range(0, max(len(ms), 1), 1000):  # MLflow's log_batch limit is 1000 metrics per call
            self.client.log_batch(run_id, metrics=ms[i:i + 1000], params=ps if i == 0 else [],
                                  tags=ts if i == 0 else [])

    def log_trial(self, trial: FrozenTrial) -> None:
        if trial.number in self.children or trial.state not in RUN_STATUS:
            return
        try:
            self._log_trial(trial)
        except Exception as exc:  # noqa: BLE001 - a tracking hiccup must not end the study
            log.warning("MLflow: trial %d not logged (%s); the study goes on", trial.number, exc)

    def run_name(self, trial: FrozenTrial) -> str:
        """``#7 compile.mode=max-autotune, amp.dtype=bfloat16``: what this trial changed (fixed knobs are
        the same in every trial of the study, so they are left out)."""
        record = TrialRecord.of(trial)
        config = record.config or trial.params
        changed = [f"{k}={v}" for k, v in config.items()
                   if k in KNOBS and k not in self.settings.fixed_knobs and v != KNOBS[k][1]]
        what = f"{record.baseline} baseline" if record.baseline else ", ".join(changed) or "defaults"
        if record.duplicate_of is not None:
            what += f" (= #{record.duplicate_of})"
        if not record.is_search:  # a repeat: which phase, round and candidate
            what = f"{record.phase} r{record.round} {record.label}: {what}"
        return f"#{trial.number} {what}"[:250]

    def environment(self, result: Measurement) -> Environment:
        if result.environment:
            return result.environment
        if self._environment is None:
            # A pruned or crashed trial reports nothing: the study's other trials ran on the same machine.
            known = (TrialRecord.of(t).measured.environment for t in self.study.get_trials(deepcopy=False))
            self._environment = next((e for e in known if e), None) or local_environment(self.settings.device)
        return self._environment

    def _log_trial(self, trial: FrozenTrial) -> None:
        record = TrialRecord.of(trial)
        env = self.environment(record.measured)
        config = record.config or trial.params
        params = {**{k: config.get(k, INACTIVE) for k in KNOBS}, **self.workload_params()}
        tags = child_tags(trial, record, env, self.study.study_name, self.settings.workload.world_size)
        runs = {number: run_id for number, (run_id, _) in self.children.items()}
        tags[PARENT_TAG] = parent_for(trial, identities(self.study.get_trials(deepcopy=False)), runs, self.parent_id)
        speedups = self.speedups(record.measured) if record.measured.ok else {}
        metrics = child_metrics(trial, record, self.settings.objective.horizon_steps, speedups)
        trial_dir = Path(record.trial_dir) if record.trial_dir else None
        start = int(trial.datetime_start.timestamp() * 1000) if trial.datetime_start else None
        end = int(trial.datetime_complete.timestamp() * 1000) if trial.datetime_complete else None
        run = self.client.create_run(self.experiment_id, start_time=start, run_name=self.run_name(trial),
                                     tags={k: str(v) for k, v in tags.items()})  # over HTTP, strings only
        run_id = run.info.run_id
        self._batch(run_id, metrics, params, timestamp_ms=end)
        if trial_dir is not None and record.duplicate_of is None:  # a copy's files are its original's
            for file in (*TRIAL_FILES, *sorted(p.name for p in trial_dir.glob("error.rank*.json"))):
                if (trial_dir / file).is_file():
                    self.client.log_artifact(run_id, str(trial_dir / file), artifact_path="trial")
        self.client.set_terminated(run_id, status=RUN_STATUS[trial.state], end_time=end)
        self.children[trial.number] = (run_id, {m[0] for m in metrics})
        self.placed[trial.number] = tags[PARENT_TAG]

    def speedups(self, result: Measurement) -> dict[str, float]:
        """Steady-state speedup over each measured baseline: baseline step time / this step time."""
        out = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            base = TrialRecord.of(t)
            if base.baseline and base.measured.ok and base.duplicate_of is None:
                out[base.baseline] = base.measured.step_s / result.step_s
        return out

    # -- the end of the study --------------------------------------------------------------------------

    def finish(self, report: Any, run_dir: Path) -> None:
        try:
            self._finish(report, run_dir)
        except Exception as exc:  # noqa: BLE001 - the study's own files are already written
            log.warning("MLflow: study summary not logged (%s)", exc)

    def abandon(self, why: str) -> None:
        """The study stopped with an error before its report (a script that does not train): its parent run says
        so, FAILED with the error as a tag, rather than staying RUNNING."""
        try:
            self.client.set_tag(self.parent_id, "autocompile.error", why[:5000])
            self.client.set_terminated(self.parent_id, status="FAILED")
        except Exception as exc:  # noqa: BLE001 - the error itself is what the user must see
            log.warning("MLflow: the study's error not logged (%s)", exc)

    def _finish(self, report: Any, run_dir: Path) -> None:
        from autocompile.report.tracking.plots import trial_rows, write_plots, write_tables

        self.converge()
        with file_lock(run_dir / PARENT_LOCK):  # tuners finishing together: the last reads all the others logged
            self.children = self._children()
            self.sync()  # and places every run
        self._backfill_speedups()
        for file in PARENT_FILES:
            if (run_dir / file).is_file():
                self.client.log_artifact(self.parent_id, str(run_dir / file))
        with tempfile.TemporaryDirectory() as tmp:
            config = run_dir / "config.yaml"
            if config.is_file():
                (Path(tmp) / "config.yaml").write_text(resolved_config(config.read_text()))
                self.client.log_artifact(self.parent_id, str(Path(tmp) / "config.yaml"))
        if (run_dir / ".hydra" / "overrides.yaml").is_file():
            self.client.log_artifact(self.parent_id, str(run_dir / ".hydra" / "overrides.yaml"), "hydra")

        trials = self.study.get_trials(deepcopy=False)
        rows = trial_rows(trials, self.settings.objective.horizon_steps)
        for row in rows:
            row["run_id"] = self.children.get(row["trial"], ("",))[0]
        write_tables(rows, report.effects, run_dir / "tables")
        self.client.log_artifacts(self.parent_id, str(run_dir / "tables"), "tables")
        try:
            write_plots(rows, [e.number for e in report.pareto], report.effects, self.study.directions,
                        report.objective, run_dir / "plots")
            self.client.log_artifacts(self.parent_id, str(run_dir / "plots"), "plots")
        except Exception as exc:  # noqa: BLE001 - a plotting problem must not hide the numbers
            log.warning("MLflow: plots not made (%s)", exc)

        trial_count = report.counts.get("trials", len(trials))
        metrics, tags = parent_summary(report, {n: run for n, (run, _) in self.children.items()}, trial_count)
        tags.update(answer_tags(run_dir))
        self._batch(self.parent_id, metrics, tags=tags)
        self.client.set_terminated(self.parent_id, status="FINISHED")

    def _backfill_speedups(self) -> None:
        """A trial that ran before a baseline gets its speedup over that baseline at the end, so every
        complete child carries the same speedup metrics (compare views plot only shared metrics)."""
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            result = TrialRecord.of(trial).measured
            if trial.number not in self.children or not result.ok:
                continue
            run_id, keys = self.children[trial.number]
            missing = [(f"speedup_vs_{name}", v, 0) for name, v in self.speedups(result).items()
                       if f"speedup_vs_{name}" not in keys]
            if missing:
                self._batch(run_id, missing)
                keys.update(m[0] for m in missing)


def tracker_for(settings: Settings, study: optuna.Study, run_dir: Path) -> MlflowTracker | NoTracker:
    if not settings.tracking.enabled:
        return NoTracker()
    return MlflowTracker(settings, study, run_dir)
