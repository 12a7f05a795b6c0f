"""The study's observer: the live terminal view and MLflow tracking, told by the study loop as it runs
(:class:`autocompile.study.records.observers.StudyObserver`), and the report when it ends."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, TypedDict

import optuna
from optuna.trial import FrozenTrial

from autocompile.config.settings import Settings
from autocompile.report.summary import SummaryDoc, build_report, write_artifacts
from autocompile.report.terminal import print_report
from autocompile.report.tracking.runs import NoTracker, tracker_for
from autocompile.report.view import StudyView, console
from autocompile.study.records.objective import Objective
from autocompile.study.records.observers import Outcome
from autocompile.study.records.optuna_store import REFERENCE
from autocompile.study.reuse import REUSED

log = logging.getLogger(__name__)


class NoSummary(TypedDict):
    """The summary of an interrupted study whose report could not be built: an empty document."""


class Watch:
    """What a study shows (the live view) and records (MLflow) while it runs."""

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.tracker: Any = NoTracker()
        self.objective: Objective | None = None
        self.remaining: Any = None
        self.lock = threading.Lock()  # one writer at a time into the tracking store, from any slot

    def opened(self, study: optuna.Study, objective: Objective, remaining: Any) -> None:
        self.objective, self.remaining = objective, remaining
        self.tracker = tracker_for(self.settings, study, self.run_dir)

    def live(self, table: bool = True, estimate: bool = True) -> StudyView:
        settings = self.remaining.settings if self.remaining is not None else self.settings  # a re-verification's
        return StudyView(settings.study.n_trials, self.objective, self.remaining if estimate else None,
                         show_table=table)

    def recorded(self, trial: FrozenTrial) -> None:
        with self.lock:
            self.tracker.log_trial(trial)

    def failed(self, why: str) -> None:
        """The study stopped with an error before its report (``ConfigError`` from inside it)."""
        with self.lock:
            self.tracker.abandon(why)

    def report(self, outcome: Outcome) -> SummaryDoc | NoSummary:
        """The summary: built from the study, written next to it, printed, and logged to the parent run. An
        interrupted study's report may be incomplete: it warns instead of failing."""
        try:
            report = build_report(outcome.study, self.settings, outcome.objective, outcome.space,
                                  outcome.stop_reason, outcome.wall_s, self.run_dir)
            write_artifacts(report, self.run_dir)
            print_report(report)
            if (line := reuse_line(outcome.study)) is not None:
                console().print(line)
            self.tracker.finish(report, self.run_dir)
        except Exception as exc:
            if not outcome.interrupted:
                raise
            log.warning("the report of the interrupted study is incomplete: %r", exc)
            return {}
        return report.summary


def reuse_line(study: optuna.Study) -> str | None:
    """What the study started from (:mod:`autocompile.study.reuse`), or None."""
    kept = study.user_attrs.get(REUSED)
    if not kept:
        return None
    if kept["exact"]:
        n = kept.get("contenders", 0)
        rivals = f", the {n} rival(s) its study could not rule out" if n else ""
        ref = "; losses checked against its eager reference (the same identity)" \
            if (study.user_attrs.get(REFERENCE) or {}).get("reused_from") else ""
        return (f"[bold]Reused[/] the answer of study {kept['study']} ({kept['finished']}, {kept['source']}): "
                f"{kept['winner']}, re-verified above against eager and default compile{rivals}, side by side, on "
                f"this machine today (the known winner kept unless beaten beyond the noise){ref}; study.reuse=off "
                "runs the full study.")
    return (f"[bold]Started from[/] a related answer (study {kept['study']}, {kept['finished']}, {kept['source']}; "
            f"differs in {', '.join(kept['differs'])}): its {kept['queued']} best configurations measured first.")
