"""Which trial measures a compiled program: one already measured, or one in flight that compiled it first.

Two configurations can compile one program (the placement order on a CPU, autocast on a model without matmuls):
their steps time the same code, so a program is measured once. In flight, two trials may compile it at nearly
the same moment. The first to report its compile claims the program (under the run's claim lock); one that
compiles it later is stopped once compiled, waits for the first to end, and is told what the first measured.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autocompile.study.records.optuna_store import CLAIM_LOCK, file_lock, running_twin, same_program, wait_finished
from autocompile.study.records.record import TrialRecord, set_attrs
from autocompile.study.search.tell import FindTwin, Twin
from autocompile.trial.launcher import INTERRUPT


def search_twins(study: optuna.Study, trial: optuna.Trial, run_dir: Path, patience_s: float,
                 beat: Callable[[], None], *, measured_anyway: bool = False) -> FindTwin:
    """``trial``'s twin finder: a complete trial that measured the program stands for it; failing that, a running
    trial that claimed the program first is waited for (up to ``patience_s``); failing that, ``trial`` claims it.

    ``measured_anyway``: a trial measured whatever it compiles (a baseline, a near miss measured again): it only
    claims its program, so that trials in flight beside it wait for it."""
    claimed: set[str] = set()

    def name(other: FrozenTrial) -> str:
        return f"the same program as trial {other.number} ({TrialRecord.of(other).name})"

    def twin_of(fingerprint: str) -> Twin | None:
        done = None if measured_anyway else same_program(study, fingerprint, trial.number)
        if done is not None:
            return Twin(done.number, name(done), done)
        if fingerprint in claimed:
            return None  # this trial measures it
        with file_lock(run_dir / CLAIM_LOCK):
            first = running_twin(study, fingerprint, trial.number, field="program")
            if first is None or measured_anyway:
                set_attrs(trial, program=fingerprint)
                claimed.add(fingerprint)
                return None
        number = first.number
        return Twin(number, name(first), pending=lambda: wait_finished(study, number, patience_s, beat,
                                                                        stop=INTERRUPT))

    return twin_of
