"""A measured trial as the report shows it: the best, the baselines, the Pareto front, the recommendation.

``summary.json`` holds these as dicts (:meth:`Entry.as_dict`); the report, MLflow's study note and the
snippet read the typed entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from autocompile.study.records.objective import Objective
from autocompile.study.records.record import Measurement, TrialRecord


@dataclass
class Entry:
    """One complete, measured trial of the search."""

    number: int
    """Its Optuna trial number."""
    name: str
    """Its knobs that differ from the defaults, for people."""
    config: dict[str, Any]
    """Its active knobs, by dotted key (what ``best_config.*`` applies)."""
    baseline: str | None
    """``eager``, ``compile``... when it is a queued baseline."""
    result: Measurement
    """What it measured."""
    time_to_train_s: float
    """Compile plus ``objective.horizon_steps`` steps, in seconds."""
    trial_dir: str | None
    """Where it ran (logs, result.json, compile artifacts)."""

    @classmethod
    def of(cls, trial: FrozenTrial, objective: Objective) -> Entry:
        record = TrialRecord.of(trial)
        return cls(trial.number, record.name, record.config, record.baseline, record.measured,
                   objective.time_to_train(record.measured), record.trial_dir)

    def as_dict(self) -> dict[str, Any]:
        """As ``summary.json`` keeps it."""
        return {"number": self.number, "name": self.name, "config": self.config, "baseline": self.baseline,
                "result": self.result.to_dict(), "time_to_train_s": self.time_to_train_s,
                "trial_dir": self.trial_dir}
