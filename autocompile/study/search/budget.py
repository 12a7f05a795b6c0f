"""The search's budget: trials handed out while the study needs more, across slots and tuner processes, until
``study.n_trials`` counted, the timeout, the failure guard or an interruption stops it."""

from __future__ import annotations

import threading
import time
import warnings

import optuna
from optuna.trial import TrialState

from autocompile.config.settings import Settings
from autocompile.study.records.observers import LiveView
from autocompile.study.records.optuna_store import counted, owner, recover_interrupted, requeue
from autocompile.study.records.record import TrialRecord, set_attrs

FAILURE_GUARD_MIN_TRIALS = 5
"""The failure guard judges a study once this many trials finished."""


class Budget:
    """Hands out trials while the study needs more, across slots and across tuner processes.

    Trials running elsewhere count towards ``n_trials``, but a tuner that finds the rest of the
    budget running elsewhere waits instead of leaving: such a trial may yet die with its tuner and
    need measuring again (found by pid on this host, by heartbeat on a database storage).
    """

    def __init__(self, study: optuna.Study, settings: Settings, stop: threading.Event | None = None) -> None:
        self.study = study
        self.settings = settings.study
        self.patience_s = settings.patience_s
        self.started = time.time()
        self.stop_reason = f"{self.settings.n_trials} trials finished"
        self.lock = threading.Lock()
        # Set: no more trials. The tuner passes the launcher's INTERRUPT: running launches stop too.
        self.stop = stop if stop is not None else threading.Event()
        self.released: list[int] = []
        self.extra = 0
        """Trials allowed beyond n_trials: the near-miss prunes measured once more (``Runner.remeasure``)."""

    def interrupt(self) -> None:
        """No more trials from now on; with the launcher's event, running launches kill their trials."""
        self.stop_reason = "interrupted"
        self.stop.set()

    def release(self, why: str, number: int | None = None) -> None:
        """Trial ``number``, or every trial this process holds, if still RUNNING: failed and marked
        interrupted (not counted), its configuration queued again for the study's next run."""
        me = owner()
        with self.lock:
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                mine = t.number == number or (number is None and TrialRecord.of(t).owner == me)
                if mine and requeue(self.study, t, why):  # False: another tuner recovered it meanwhile
                    self.released.append(t.number)

    def next_trial(self, view: LiveView) -> optuna.Trial | None:
        waiting_since = None
        while True:
            if self.stop.is_set():
                return None
            with self.lock:
                recover_interrupted(self.study)
                trials = self.study.get_trials(deepcopy=False)
                view.refresh(trials)
                done = sum(counted(t) for t in trials)
                running = sum(t.state == TrialState.RUNNING for t in trials)
                if done >= self.settings.n_trials + self.extra:
                    return None
                if self.settings.timeout_s and time.time() - self.started > self.settings.timeout_s:
                    self.stop_reason = f"study.timeout_s={self.settings.timeout_s:g} reached"
                    return None
                if failing(trials, self.settings.max_failure_rate):
                    self.stop_reason = "failure guard"
                    return None
                if done + running < self.settings.n_trials + self.extra:
                    with warnings.catch_warnings():  # we beat ourselves: ask/tell is our optimize loop
                        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
                        trial = self.study.ask()
                    set_attrs(trial, owner=owner())
                    return trial
            waiting_since = waiting_since or time.time()
            if time.time() - waiting_since > self.patience_s:
                self.stop_reason = f"the last {running} trial(s) still run elsewhere after {self.patience_s:g} s"
                return None
            self.stop.wait(1.0)


def failing(trials: list[optuna.trial.FrozenTrial], max_rate: float) -> bool:
    finished = [t for t in trials if counted(t)]
    failed = sum(t.state == TrialState.FAIL for t in finished)
    return len(finished) >= FAILURE_GUARD_MIN_TRIALS and failed / len(finished) > max_rate
