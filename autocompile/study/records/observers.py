"""What the study loop tells the outside while it runs, and what it hands over when it ends.

The loop (:mod:`autocompile.study.tuner`) never calls report code: it notifies a
:class:`StudyObserver` (the live view and MLflow tracking are one, ``report.watch.Watch``, wired by
the app) and returns an :class:`Outcome` that the report turns into the summary. So the flow reads in
one direction: config -> workload -> trial -> study -> report.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from autocompile.config.space import SearchSpace
from autocompile.study.records.objective import Objective


class LiveView(Protocol):
    """A live display of one stage: what runs, and the trials so far."""

    def running(self, key: int | str, text: str, trial_dir: Path | None = None) -> None:
        """Trial ``key`` (or a named wait such as ``reference``) runs; its directory holds its progress events."""

    def finished(self, key: int | str) -> None:
        """It is over."""

    def refresh(self, trials: list[FrozenTrial]) -> None:
        """The study's trials changed (and with them the time left)."""


class StudyObserver(Protocol):
    """Told by the study loop as it runs."""

    def opened(self, study: optuna.Study, objective: Objective, remaining: Any) -> None:
        """The study is open (MLflow opens its parent run here: an unusable store fails before any trial);
        ``remaining``: the study's ``estimate.Remaining``."""

    def live(self, table: bool = True, estimate: bool = True) -> AbstractContextManager[LiveView]:
        """A live display for one stage (the reference, the search, the phases): ``table`` shows the trials
        table, ``estimate`` the time left."""

    def recorded(self, trial: FrozenTrial) -> None:
        """A trial finished and its record is complete (MLflow logs its child run); called from any slot."""


class Quiet:
    """An observer that shows and records nothing (a study run from code or a test)."""

    def opened(self, study: optuna.Study, objective: Objective, remaining: Any) -> None:
        pass

    def live(self, table: bool = True, estimate: bool = True) -> AbstractContextManager[LiveView]:
        return nullcontext(NO_VIEW)

    def recorded(self, trial: FrozenTrial) -> None:
        pass


class _NoView:
    def running(self, key: int | str, text: str, trial_dir: Path | None = None) -> None:
        pass

    def finished(self, key: int | str) -> None:
        pass

    def refresh(self, trials: list[FrozenTrial]) -> None:
        pass


NO_VIEW: LiveView = _NoView()
"""A view that shows nothing: the phases' repeats are shown by their own stage's view, not per trial."""


@dataclass
class Outcome:
    """How a study run ended: what the report reads (with the study itself)."""

    study: optuna.Study
    """The study, every trial of every run of it included."""
    space: SearchSpace
    """The space it searched."""
    objective: Objective
    """What "best" means."""
    stop_reason: str
    """Why the search stopped (``20 trials finished``, ``interrupted``, ``failure guard``, a timeout)."""
    wall_s: float
    """Seconds the study has run, over every run of it (:func:`study_wall`)."""
    interrupted: bool
    """Ctrl-C or SIGTERM stopped it: running trials were queued again."""
    released: int
    """Trials stopped and queued again because of the interruption."""


RUNS = "runs"
"""Study attribute: each run of the study (a tuner's, a resumed one's), ``[start, end]`` in epoch seconds."""


def study_wall(study: optuna.Study, started: float) -> float:
    """Seconds the study has run: this run (from ``started``, recorded now if it started a trial) and its earlier
    ones, tuners that ran side by side counted once: a resumed study that only reprints its result adds nothing."""
    trials = [(t.datetime_start.timestamp(), t.datetime_complete.timestamp() if t.datetime_complete else started)
              for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
    before = [span for span in trials if span[0] < started]
    runs = study.user_attrs.get(RUNS) or (  # a study recorded before its runs were: its trials' span
        [[min(a for a, _ in before), max(b for _, b in before)]] if before else [])
    if len(before) < len(trials):  # this run started a trial
        runs = sorted([*runs, [started, time.time()]])
        study.set_user_attr(RUNS, runs)
    spans = sorted(runs)
    if not spans:  # nothing measured yet (stopped at the reference)
        return time.time() - started
    total, reach = 0.0, -float("inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


class StudyFailing(RuntimeError):
    """Most trials fail: the workload or the environment is broken, not the configurations."""


class StudyInterrupted(RuntimeError):
    """Ctrl-C: running trials were stopped and queued again; the same command resumes the study."""


def ending_error(outcome: Outcome, max_failure_rate: float, run_dir: Path) -> RuntimeError | None:
    """What the command ends with after its report: interrupted, or stopped by the failure guard."""
    if outcome.interrupted:
        return StudyInterrupted(f"{outcome.released} running trial(s) stopped and queued again; rerun the same "
                                f"command to resume the study in {run_dir}")
    if outcome.stop_reason == "failure guard":
        return StudyFailing(f"stopped: more than {max_failure_rate:.0%} of trials failed; see "
                            f"the reasons above and in {run_dir / 'trials'}")
    return None
