"""A study's answer, kept where the team looks and found again by what it answers (issue 52).

An answer holds only for the job it measured: :func:`answer_key` hashes what must match (the model's structure, the
workload, world size and the fixed knobs, the objective, the machine's device, the torch / triton / CUDA versions,
the knob table). ``exact`` is that hash; ``related`` keeps only the model's structure and the device, so another
batch size or a new torch finds the ranking without taking it as this job's answer. A finished study keeps its answer
in its run directory (``answer.json``, the file a machine with no shared store imports with ``study.reuse_from``) and
on its MLflow parent run (tags a search by key finds, over a shared tracking server as well as the SQLite file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.gpus import device_name
from autocompile.config.knobs import KNOBS
from autocompile.config.settings import Settings, versions
from autocompile.study.phases.confirmation import confirmed
from autocompile.study.phases.plans import ranked_trials, recommended
from autocompile.study.phases.racing import compile_spread, study_noise
from autocompile.study.records.objective import Objective
from autocompile.study.records.record import TrialRecord
from autocompile.study.search.numerics import reference

log = logging.getLogger(__name__)

ANSWER_FILE = "answer.json"
"""In a finished study's run directory: its answer, to copy to a machine with no shared store."""
KEY_TAG = "autocompile.answer_key"
RELATED_TAG = "autocompile.answer_related"
ANSWER_TAG = "autocompile.answer"
"""Tags of the study's MLflow parent run: the exact key, the related key, the answer as JSON."""
RIVALS = 4
"""Confirmation candidates kept beside the winner (a related study measures the ranking's first ones first)."""


@dataclass(frozen=True)
class AnswerKey:
    """What an answer answers: ``exact`` must match for it to stand for this job; ``related`` is the same model on
    the same device (another batch, version or world size)."""

    exact: str
    related: str
    fields: dict[str, str]
    """What was hashed, field by field: the report says which differ."""


def model_fingerprint(settings: Settings) -> str:
    """The script's path, source and arguments; or the model's module tree and parameter shapes, built on the meta
    device (no memory, no init)."""
    if settings.script.given:
        return digest([str(Path(settings.script.path).resolve()), settings.script.source_hash(), settings.script.args])
    import torch

    from autocompile.workload.models import build

    try:
        with torch.device("meta"):
            model = build(settings.model.target, settings.model.kwargs)
        tree = [(name, type(m).__name__, [list(p.shape) for p in m.parameters(recurse=False)])
                for name, m in model.named_modules()]
    except Exception as exc:  # noqa: BLE001 - user code: the model's name and arguments stand in
        log.debug("model not built for its fingerprint: %r", exc)
        tree = [settings.model.target, settings.model.kwargs]
    return digest(tree)


def cuda_version() -> str:
    import torch

    return str(torch.version.cuda or "")


def answer_key(settings: Settings) -> AnswerKey:
    w, o = settings.workload, settings.objective
    fields = {
        "model": model_fingerprint(settings),
        "workload": digest([w.batch_size, w.seq_len, w.grad_accum_steps, str(w.data), str(w.loss), str(w.optimizer),
                            str(w.lr_schedule), w.grad_clip_norm]),
        "world_size": str(w.world_size),
        "fixed_knobs": digest(sorted(settings.fixed_knobs.items())),
        "objective": digest([o.kind, o.horizon_steps, o.memory_limit_gb]),
        "device": device_name(settings.device),
        **versions(),  # torch, triton, transformers where installed
        "cuda": cuda_version(),
        # The knobs, their defaults, fixed values and conditions in words: a knob or value added changes it.
        "knob_table": digest([(k, default, None if callable(spec.values) else spec.values,
                               spec.when.text if spec.when else "") for k, (spec, default) in KNOBS.items()]),
    }
    return AnswerKey(digest(sorted(fields.items())), digest([fields["model"], fields["device"]]), fields)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Answer:
    """A finished study's recommendation, with what it was measured against."""

    key: str
    related: str
    fields: dict[str, str]
    study: str
    """The study's name."""
    finished: str
    """When it finished (UTC, ISO 8601)."""
    winner: dict[str, Any]
    """The recommended configuration (its active knobs)."""
    winner_name: str
    decided: bool
    """The confirmation decided the winner (side by side, beyond the noise)."""
    rivals: list[dict[str, Any]] = field(default_factory=list)
    """The confirmation's other candidates, best first (at most :data:`RIVALS`)."""
    ranking: list[dict[str, Any]] = field(default_factory=list)
    """The search's feasible configurations, best first (a related study measures them first)."""
    contenders: list[dict[str, Any]] = field(default_factory=list)
    """The rivals its confirmation could not rule out against the winner (tied within the margin, undetermined),
    baselines left out: a re-verification races them again beside the winner and the baselines."""
    priors: dict[str, Any] = field(default_factory=dict)
    """What its study measured of the machine's noise, for a related study to start from: ``compile_cv`` and
    ``compile_df`` (one cold compile's spread, the study's own part), ``alone_noise`` and ``alone_df`` (step time
    across fresh alone processes), ``device``; a key is absent where the study measured none."""
    reference: dict[str, Any] = field(default_factory=dict)
    """Its study's numerics reference (eager fp32 losses over the compared steps, step time, peak memory): a
    re-verification with the same :attr:`numerics_key` checks its trials' losses against it, not eager run again."""
    numerics_key: str = ""
    """What eager's losses depend on, hashed: everything a study's measurements share
    (:meth:`Settings.measured_on`: the model, its arguments and code, the workload with its seed, the measurement,
    the device and versions). The answer's key leaves some of it out (a seed, a model argument that changes no
    shape); its reference is lent only where this matches too."""
    source: str = ""
    """Where it was found: ``mlflow run <id>`` or a file (set on reading)."""

    def to_json(self, limit: int = 0) -> str:
        """As JSON; with ``limit`` (an MLflow tag's length), the ranking's tail left out until it fits."""
        data = {k: v for k, v in asdict(self).items() if k != "source"}
        text = json.dumps(data, sort_keys=True)
        if limit and len(text) > limit:  # the reference goes first: a re-verification can measure its own
            data["reference"] = {}
            text = json.dumps(data, sort_keys=True)
        while limit and len(text) > limit and data["ranking"]:
            data["ranking"] = data["ranking"][:-1]
            text = json.dumps(data, sort_keys=True)
        return text

    @classmethod
    def from_json(cls, text: str, source: str) -> Answer:
        data = json.loads(text)
        return cls(**{**{k: data[k] for k in cls.__dataclass_fields__ if k in data}, "source": source})


def answer_of(study: optuna.Study, objective: Objective, settings: Settings, key: AnswerKey) -> Answer | None:
    """The study's answer, or None when it recommends nothing."""
    winner, _ = recommended(study, objective)
    if winner is None:
        return None
    race = confirmed(study, objective)
    rivals = [row.config for row in (race.candidates if race else []) if row.trial != winner.number][:RIVALS]
    contenders = [row.config for row in (race.candidates if race else []) if row.trial != winner.number
                  and row.baseline is None and row.status in ("leader", "tied", "undetermined", "faster")][:RIVALS]
    ranking = [rec.config for _, rec in ranked_trials(study, objective)]
    rec = TrialRecord.of(winner)
    return Answer(key.exact, key.related, key.fields, study.study_name,
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rec.config, rec.name or "defaults",
                  bool(race and race.decided and race.winner and race.winner.trial == winner.number), rivals, ranking,
                  contenders=contenders, priors=measured_priors(study, objective, settings),
                  reference=lent_reference(study, settings), numerics_key=numerics_key(settings))


def numerics_key(settings: Settings) -> str:
    """:attr:`Answer.numerics_key` of a study run with ``settings``."""
    return digest(settings.measured_on())


def lent_reference(study: optuna.Study, settings: Settings) -> dict[str, Any]:
    """The study's numerics reference as an answer keeps it: its losses over the steps a trial's are compared on
    (``objective.loss_steps``); one it was lent keeps where it was measured (``reused_from``)."""
    ref = dict(reference(study) or {})
    if not ref:
        return {}
    ref["losses"] = list(ref.get("losses") or [])[:settings.objective.loss_steps]
    return ref


def measured_priors(study: optuna.Study, objective: Objective, settings: Settings) -> dict[str, Any]:
    """What ``study`` measured of this machine's noise (:attr:`Answer.priors`)."""
    found: dict[str, Any] = {"device": device_name(settings.device)}
    spread = compile_spread(study, objective.settings)
    if spread.measured_cv is not None and spread.measured_df >= 1:
        found.update(compile_cv=spread.measured_cv, compile_df=spread.measured_df)
    if (noise := study_noise(study, "alone")) is not None:
        found.update(alone_noise=noise.rel_sd, alone_df=noise.df)
    return found


def keep(answer: Answer, run_dir: Path) -> Path:
    """Write ``answer.json`` in the run directory (atomically: a half-written file is never read, and of two tuners
    ending together the last one's stands whole)."""
    path = run_dir / ANSWER_FILE
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".answer.", suffix=".tmp")  # one per writer: two tuners may end
    with os.fdopen(fd, "w") as out:
        out.write(answer.to_json())
    Path(tmp).replace(path)
    return path


def read_file(path: Path) -> Answer | None:
    """An exported answer; None (with a warning) when it cannot be read."""
    try:
        return Answer.from_json(path.read_text(), f"file {path}")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("study.reuse_from=%s: not an answer autocompile can read (%s); the study runs in full", path, exc)
        return None


def answer_runs(tracking_uri: str, where: str, limit: int) -> list[Any]:
    """The store's study parent runs matching ``where`` (a tag filter), newest first, over every experiment."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    return client.search_runs(experiments, where, order_by=["attributes.start_time DESC"],
                              max_results=limit) if experiments else []


def answer_in(run: Any) -> Answer | None:
    """The answer a parent run's tag holds; None (with a warning) when it cannot be read."""
    try:
        return Answer.from_json(run.data.tags.get(ANSWER_TAG) or "", f"mlflow run {run.info.run_id}")
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("MLflow run %s: its answer cannot be read (%s); skipped", run.info.run_id, exc)
        return None


def find_in_store(tracking_uri: str, key: AnswerKey) -> Answer | None:
    """The newest answer of ``key`` (exact, else related) on a study's parent run in the MLflow store; None (with a
    warning when the store cannot be read) otherwise."""
    try:
        for tag, value in ((KEY_TAG, key.exact), (RELATED_TAG, key.related)):
            for run in answer_runs(tracking_uri, f"tags.`{tag}` = '{value}'", 5):
                if (answer := answer_in(run)) is not None:
                    return answer
    except Exception as exc:  # noqa: BLE001 - an unreachable or broken store must not stop the study
        log.warning("answers: the MLflow store %s cannot be searched (%s); the study runs in full", tracking_uri, exc)
    return None


def list_answers(tracking_uri: str, limit: int = 200) -> list[Answer]:
    """Every answer on a parent run of the store, newest first (the ``task=answers`` table); unreadable ones left out
    with a warning."""
    runs = answer_runs(tracking_uri, f"tags.`{KEY_TAG}` LIKE '%'", limit)
    return [answer for run in runs if (answer := answer_in(run)) is not None]


def differences(answer: Answer, key: AnswerKey) -> list[str]:
    """The key's fields that differ from the answer's: why it is related, not exact."""
    return [name for name, value in key.fields.items() if answer.fields.get(name) != value]
