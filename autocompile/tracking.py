"""MLflow tracking: one parent run per study, one child run per trial, comparable in the MLflow UI.

Only the tuner writes to MLflow (workers write files). Child runs carry every knob under its
dotted key as a param, the measurements as metrics (per-step loss and per-window throughput as
histories), the Optuna state and reasons as tags, and the trial's files as artifacts. A resumed
study continues under its parent run and skips trials that already have a child run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.settings import ConfigError, Settings

log = logging.getLogger(__name__)

STUDY_TAG = "autocompile.study"
TRIAL_TAG = "autocompile.trial_number"
PARENT_ATTR = "mlflow_parent_run_id"
TRIAL_FILES = ("trial.json", "result.json", "cmd.txt", "stdout.log", "stderr.log", "progress.jsonl")
RUN_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.FAIL: "FAILED", TrialState.PRUNED: "KILLED"}
METRICS = ("tokens_per_s", "step_s", "step_s_cv", "compile_s", "first_step_s", "peak_memory_bytes", "mfu",
           "graph_count", "graph_breaks", "recompiles_timed", "wall_s")


@contextlib.contextmanager
def quick_http() -> Iterator[None]:
    """MLflow retries HTTP calls for minutes by default; a reachability check should answer in seconds."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_store(uri: str) -> None:
    """Fail before any trial when the tracking store cannot be reached or written."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # schema creation chatter of a new store
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    try:
        with quick_http():
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"tracking.uri={uri} is not reachable ({first}); start the server, fix the URI, "
                          "or set tracking.enabled=false") from exc


def experiment_name(settings: Settings) -> str:
    w = settings.workload
    return settings.tracking.experiment or (
        f"autocompile/{settings.model.name}/bs{w.batch_size}-seq{'-'.join(map(str, w.seq_len))}-"
        f"ws{w.world_size}-{settings.device}")


class NoTracker:
    """``tracking.enabled=false``."""

    def log_trial(self, trial: FrozenTrial) -> None:
        pass

    def finish(self, report: Any, run_dir: Path) -> None:
        pass


class MlflowTracker:
    def __init__(self, settings: Settings, study: optuna.Study, run_dir: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.settings = settings
        self.study = study
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        name = experiment_name(settings)
        experiment = self.client.get_experiment_by_name(name)
        self.experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.parent_id = self._parent_run(run_dir)
        self.logged = {
            int(r.data.tags[TRIAL_TAG])
            for r in self.client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.parent_id}'",
                                             max_results=50000)
            if TRIAL_TAG in r.data.tags
        }
        # Trials finished before this tuner started (a resume, or another tuner process) are logged now.
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.FAIL)):
            self.log_trial(trial)

    def _parent_run(self, run_dir: Path) -> str:
        parent = self.study.user_attrs.get(PARENT_ATTR)
        if parent:
            self.client.update_run(parent, status="RUNNING")
            return parent
        w = self.settings.workload
        run = self.client.create_run(self.experiment_id, run_name=self.study.study_name, tags={
            STUDY_TAG: self.study.study_name, "autocompile.run_dir": str(run_dir),
            "autocompile.storage": self.settings.study.storage or str(run_dir / "optuna.journal"),
            "mlflow.note.content": f"autocompile study {self.study.study_name}: {self.settings.model.name}, "
                                   f"objective {self.settings.objective.kind}",
        })
        params = {"model": self.settings.model.name, "workload.batch_size": w.batch_size,
                  "workload.seq_len": ",".join(map(str, w.seq_len)), "workload.world_size": w.world_size,
                  "workload.device": self.settings.device, "objective.kind": self.settings.objective.kind,
                  "objective.horizon_steps": self.settings.objective.horizon_steps,
                  **{f"fixed.{k}": v for k, v in self.settings.fixed_knobs.items()}}
        self._batch(run.info.run_id, params=params)
        self.study.set_user_attr(PARENT_ATTR, run.info.run_id)
        return run.info.run_id

    def _batch(self, run_id: str, metrics: list[tuple[str, float, int]] = (), params: dict[str, Any] | None = None,
               tags: dict[str, Any] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, step) for k, v, step in metrics]
        ps = [Param(k, str(v)) for k, v in (params or {}).items()]
        ts = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        for i in range(0, max(len(ms), 1), 1000):  # MLflow's log_batch limit is 1000 metrics per call
            self.client.log_batch(run_id, metrics=ms[i:i + 1000], params=ps if i == 0 else [],
                                  tags=ts if i == 0 else [])

    def log_trial(self, trial: FrozenTrial) -> None:
        if trial.number in self.logged or trial.state not in RUN_STATUS:
            return
        try:
            self._log_trial(trial)
            self.logged.add(trial.number)
        except Exception as exc:  # noqa: BLE001 - a tracking hiccup must not end the study
            log.warning("MLflow: trial %d not logged (%s); the study goes on", trial.number, exc)

    def _log_trial(self, trial: FrozenTrial) -> None:
        attrs = trial.user_attrs
        result = attrs.get("result") or {}
        env = result.get("environment") or {}
        name = f"#{trial.number} {attrs.get('name', '')}"[:250]
        run = self.client.create_run(self.experiment_id, run_name=name, tags={
            "mlflow.parentRunId": self.parent_id, TRIAL_TAG: trial.number, STUDY_TAG: self.study.study_name})
        run_id = run.info.run_id
        params = {**attrs.get("config", {}), "model": self.settings.model.name,
                  "workload.batch_size": self.settings.workload.batch_size,
                  "workload.seq_len": ",".join(map(str, self.settings.workload.seq_len)),
                  "workload.world_size": self.settings.workload.world_size}
        tags = {"optuna.state": trial.state.name, "status": result.get("status", trial.state.name.lower()),
                "torch": env.get("torch", ""), "device_name": env.get("device_name", ""),
                "world_size": env.get("world_size", self.settings.workload.world_size)}
        for key in ("baseline", "duplicate_of", "retry_of"):
            if key in attrs:
                tags[f"autocompile.{key}"] = attrs[key]
        reason = attrs.get("reason") or result.get("reason")
        if reason:
            tags["reason"] = reason[:5000]
            tags["mlflow.note.content"] = f"{result.get('status', trial.state.name)}: {reason}"
        if result.get("failure"):
            tags["failure"] = result["failure"]
        metrics = [(k, result[k], 0) for k in METRICS if isinstance(result.get(k), (int, float))]
        for i, v in enumerate(trial.values or []):
            metrics.append((f"objective_{i}" if len(trial.values) > 1 else "objective", v, 0))
        if result.get("status") == "ok":
            metrics.append(("time_to_train_s", result["compile_s"]
                            + self.settings.objective.horizon_steps * result["step_s"], 0))
            metrics += self._speedups(result)
        metrics += [("loss", v, i) for i, v in enumerate(result.get("losses", []))]
        metrics += [("tokens_per_s_window", v, i) for i, v in enumerate(result.get("tokens_per_s_windows", []))]
        self._batch(run_id, metrics, params, tags)
        trial_dir = Path(attrs.get("trial_dir", ""))
        for file in TRIAL_FILES:
            if (trial_dir / file).is_file():
                self.client.log_artifact(run_id, str(trial_dir / file), artifact_path="trial")
        self.client.set_terminated(run_id, status=RUN_STATUS[trial.state])

    def _speedups(self, result: dict[str, Any]) -> list[tuple[str, float, int]]:
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            base = t.user_attrs.get("baseline")
            ref = t.user_attrs.get("result")
            if base and ref and "duplicate_of" not in t.user_attrs:
                out.append((f"speedup_vs_{base}", ref["step_s"] / result["step_s"], 0))
        return out

    def finish(self, report: Any, run_dir: Path) -> None:
        try:
            for file in ("config.yaml", "summary.json", "best_config.yaml", "best_config.py"):
                if (run_dir / file).is_file():
                    self.client.log_artifact(self.parent_id, str(run_dir / file))
            best = report.best
            if best is not None:
                self._batch(self.parent_id, [("best_tokens_per_s", best["result"]["tokens_per_s"], 0),
                                             ("best_compile_s", best["result"]["compile_s"], 0),
                                             ("best_time_to_train_s", best["time_to_train_s"], 0)],
                            tags={"best_trial": best["number"], "best_config": best["name"][:5000]})
            self.client.set_terminated(self.parent_id, status="FINISHED")
        except Exception as exc:  # noqa: BLE001 - the study's own files are already written
            log.warning("MLflow: study summary not logged (%s)", exc)


def tracker_for(settings: Settings, study: optuna.Study, run_dir: Path) -> MlflowTracker | NoTracker:
    if not settings.tracking.enabled:
        return NoTracker()
    return MlflowTracker(settings, study, run_dir)
