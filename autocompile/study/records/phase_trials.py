"""The trials of a repeat phase, read from the study's records: which phase a trial ran in, how the phase
timed its candidates (``method.<phase>``: side by side or fresh processes), and a repeat's step time.

Read by the phases' planners, the race, the verdicts, the estimate and the report alike, so they sit here
below all of them, apart from the modules that run the phases.
"""

from __future__ import annotations

import logging

from optuna import Study
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import FRESH_PROCESSES, SIDE_BY_SIDE
from autocompile.study.records.optuna_store import METHOD, feasible, interrupted
from autocompile.study.records.record import TrialRecord

log = logging.getLogger(__name__)


def method(study: Study, phase: str) -> dict[str, str]:
    """How ``phase`` timed its candidates: ``{"method": SIDE_BY_SIDE | FRESH_PROCESSES, "why": ...}``."""
    return study.user_attrs.get(METHOD[phase]) or {"method": FRESH_PROCESSES, "why": "recorded before side "
                                                                                          "by side existed"}


def set_method(study: Study, phase: str, name: str, why: str = "") -> None:
    study.set_user_attr(METHOD[phase], {"method": name, "why": why})
    if name != SIDE_BY_SIDE:
        log.warning("%s phase: fresh-process rounds instead of side by side: %s", phase, why)


def phase(trial: FrozenTrial) -> str:
    return TrialRecord.of(trial).phase


def phase_trials(study: Study, name: str) -> list[FrozenTrial]:
    """Finished repeats of one phase that were not interrupted (an interrupted one is measured again), of
    the method the phase runs by (a phase that fell back from side by side leaves those trials aside)."""
    how = method(study, name)["method"]
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                                 TrialState.FAIL))
            if (rec := TrialRecord.of(t)).phase == name and not interrupted(t) and rec.method == how]


def step_time(trial: FrozenTrial) -> float | None:
    """A repeat's step time when it measured one and passed the numerics and memory checks."""
    result = TrialRecord.of(trial).measured
    if trial.state != TrialState.COMPLETE or not result.ok or not feasible(trial):
        return None
    return result.step_s
