"""The verdict phase side by side: a neighbour that cannot run beside the others leaves the rounds and says so;
the winner and the rest stay side by side (a compiled winner's twelve neighbours once all fell back to fresh
processes for one compiled-autograd neighbour: every verdict ±30-100 % instead of ±2 %)."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autocompile.study.phases.plans import Slot
from autocompile.study.phases.run import run_together
from autocompile.study.records.record import TrialRecord

LABELS = ["winner", "compile.mode=lite", "compile.compiled_autograd=True"]
BAD = "compile.compiled_autograd=True"


def run(drop_failed: bool, bad: str = BAD) -> tuple[str | None, list[list[str]]]:
    study = optuna.create_study(directions=["minimize"])
    plan = [Slot("verdict", r, label, {}) for r in range(3) for label in LABELS]
    processes: list[list[str]] = []

    def together(trials: list[optuna.Trial]) -> str | None:  # one side-by-side process, as measure_together tells
        processes.append([TrialRecord.of(t).label for t in trials])
        for t in trials:
            failed = TrialRecord.of(t).label == bad
            t.set_user_attr("result", {"status": "failed", "failure": "not_same_program", "reason": "beside"}
                            if failed else {"status": "ok", "step_s": 0.01, "step_s_windows": [0.01] * 4})
            study.tell(t, state=TrialState.FAIL) if failed else study.tell(t, 0.01)
        return f"{bad} failed beside the others (not_same_program: beside)" if bad in processes[-1] else None

    def alone(trial: optuna.Trial) -> None:
        pytest.fail(f"nothing is measured alone here: {TrialRecord.of(trial).label}")

    return run_together(study, plan, alone, together, drop_failed=drop_failed), processes


def test_a_neighbour_failing_beside_the_others_leaves_the_later_rounds_and_the_rest_stay_side_by_side() -> None:
    why, processes = run(drop_failed=True)
    assert why is None
    assert [sorted(p) for p in processes] == [sorted(LABELS), sorted(LABELS[:2]), sorted(LABELS[:2])]


def test_without_dropping_or_when_the_winner_fails_the_first_failure_is_the_reason() -> None:
    why, processes = run(drop_failed=False)  # the confirmation: every candidate or none
    assert why is not None and BAD in why and len(processes) == 1
    why, processes = run(drop_failed=True, bad="winner")
    assert why is not None and "winner" in why and len(processes) == 1
