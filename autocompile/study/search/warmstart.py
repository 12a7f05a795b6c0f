"""The winner's warm start: its compile artifacts copied next to ``best_config.py`` and a fresh process
measured with them loaded, once per winner (see :mod:`autocompile.trial.timing.compile_artifacts` for the worker side);
and the pruning of the trials' inductor caches (a cold cache per trial: up to GBs each on a GPU).

What reads a trial's cache later: a confirm or verdict repeat starts warm from a feasible complete trial's
(``study.repeat_cache=warm``), and a side-by-side process merges its candidates' cold caches. Neither
reads a failed, pruned or infeasible trial's, so that one goes once the trial is told (:func:`drop_cache`);
the rest go when the study ends, all but the winner's (:func:`prune_caches`). Each trial's
``compile_artifacts.bin`` stays: the warm start and a side-by-side candidate without a cache load it, and a
repeat of a resumed study whose cache is gone compiles cold and says so (``compile_cache``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import Knobs
from autocompile.config.knobs import TrialConfig
from autocompile.config.sections import Resources
from autocompile.config.settings import Settings
from autocompile.study.records.lone_compile import as_alone, lone_rate
from autocompile.study.records.optuna_store import WARM_START, measured_trials
from autocompile.study.records.record import TrialRecord
from autocompile.trial.launcher import Interrupted, Spec, launch
from autocompile.trial.lease import MACHINE
from autocompile.trial.slots import memory_room
from autocompile.trial.timing.compile_artifacts import ARTIFACTS, TRIAL_FILE, WarmStart
from autocompile.trial.timing.result import TrialResult

log = logging.getLogger(__name__)


@dataclass
class Winner:
    """What the warm start needs of the winner: its trial, knobs, cold compile time and saved artifacts."""

    number: int
    config: Knobs
    cold_compile_s: float
    artifacts: str | None
    """Its ``compile_artifacts.bin`` (None: an eager winner, or a backend that keeps none)."""


def take_home(settings: Settings, best: Winner, run_dir: Path, launch: Callable[[Path, Spec], TrialResult]
              ) -> WarmStart | None:
    """Copy the winner's artifacts next to ``best_config.py`` and measure a warm start of it.

    ``launch(trial_dir, spec)`` runs a trial (``launcher.launch``); ``settings`` are the study's.
    Returns cold and warm compile seconds and the saving, or None when the winner has no artifacts."""
    if not best.artifacts or not Path(best.artifacts).is_file():
        return None
    target = run_dir / ARTIFACTS
    shutil.copyfile(best.artifacts, target)
    config = TrialConfig.from_flat(best.config, settings.env, strict=False)
    spec = settings.trial_spec(config)
    # Its compile time is what it says; one timed window sets the steady state that compile time is measured
    # against (as a verdict neighbour's cold run), and no step time of it is read.
    spec = dataclasses.replace(spec, measure=dataclasses.replace(spec.measure, artifacts=str(target.resolve()),
                                                                 windows=1, precision=0.0))
    log.info("measuring a warm start of trial %s with %s", best.number, target)
    result = launch(run_dir / "warm_start", spec)
    cold = best.cold_compile_s
    if not result.ok or result.compile_s is None:
        return WarmStart(artifacts=str(target), trial=best.number, cold_compile_s=cold, status="failed",
                         reason=result.reason)
    warm = result.compile_s
    return WarmStart(artifacts=str(target), trial=best.number, status="ok", cold_compile_s=cold,
                     warm_compile_s=warm, saved_s=cold - warm, loaded=result.artifacts_loaded,
                     trial_dir=result.trial_dir, shared_wall_s=(result.lease or {}).get("compile_wall_s"))


def warm_start(study: optuna.Study, settings: Settings, winner: FrozenTrial | None,
               run_dir: Path) -> WarmStart | None:
    """The winner's warm start, measured once per winner (a resumed study keeps the measurement); kept as the
    study's ``warm_start`` attribute, which the report reads."""
    done: WarmStart | None = study.user_attrs.get(WARM_START)
    if winner is None or (done and done.get("trial") == winner.number):
        return done if winner is not None else None
    record = TrialRecord.of(winner)
    # The trial keeps its numbers, not its files: the artifacts lie in its directory (worker: save_artifacts).
    saved = Path(record.trial_dir or "/nonexistent") / TRIAL_FILE
    best = Winner(winner.number, record.config, record.measured.compile_s or 0.0,
                  str(saved) if saved.is_file() else None)

    def priced(trial_dir: Path, spec: Spec) -> TrialResult:
        # Beside the verdicts' processes its compile shared the machine: priced as a lone run's, as the cold one was.
        result = launch(trial_dir, spec)
        as_alone(result, lone_rate(TrialRecord.of(t).measured for t in measured_trials(study)))
        return result

    found = take_home(settings, best, run_dir, priced)
    if found is not None:
        study.set_user_attr(WARM_START, found)
    return found


class EarlyWarmStart:
    """The winner's warm start measured while the verdicts run, not alone after them: with processes in flight it is
    one more (its compile beside theirs, its one window in its own turn on the device), started once the verdicts
    leave a flight free, so that it fills the phase's tail. The study's end measures it again only if the
    recommendation changed (:func:`warm_start` keeps one per winner)."""

    POLL_S = 0.5

    def __init__(self, study: optuna.Study, settings: Settings, run_dir: Path, in_flight: int) -> None:
        self.study, self.settings, self.run_dir, self.in_flight = study, settings, run_dir, in_flight
        self.thread: threading.Thread | None = None
        self.done = threading.Event()

    @classmethod
    def of(cls, study: optuna.Study, settings: Settings, run_dir: Path, slots: list[Resources],
           peak_bytes: float | None) -> EarlyWarmStart | None:
        """One where processes fly (``slots``: one entry per process in flight) and memory holds one more."""
        k = slots.count(slots[0])
        if not settings.study.warm_start or k < 2 or memory_room(settings, slots[0], peak_bytes) <= k:
            return None
        return cls(study, settings, run_dir, k)

    def start(self, winner: FrozenTrial | None) -> None:
        """At the verdict phase's start, the confirmed winner known."""
        if winner is None or self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run, args=(winner,), name="warm-start", daemon=True)
        self.thread.start()

    def _run(self, winner: FrozenTrial) -> None:
        free = 0
        while not self.done.wait(self.POLL_S):
            free = free + 1 if len(MACHINE.members) < self.in_flight else 0
            if free >= 2:  # a flight free for a poll, not the moment between one process and the next
                try:
                    warm_start(self.study, self.settings, winner, self.run_dir)
                except (Interrupted, OSError) as exc:  # the tuner stops; the study's end measures it if it goes on
                    log.info("warm start beside the verdicts not measured (%s)", exc)
                return

    def finish(self) -> None:
        """The verdicts are over: a warm start not started yet is the study end's, one running is waited for."""
        self.done.set()
        if self.thread is not None:
            self.thread.join()


CACHE = "inductor_cache"
"""A trial's own cold cache, in its directory (``launcher.trial_environment``); a cache it was handed
(a warm repeat's, ``measure.cache=warm``'s shared one) lies elsewhere and is never removed here."""


def drop_cache(trial_dir: str | Path | None) -> int:
    """Remove the inductor cache in ``trial_dir``; the bytes it held."""
    cache = Path(trial_dir) / CACHE if trial_dir else None
    if cache is None or not cache.is_dir() or cache.is_symlink():
        return 0
    # Another tuner of the same study may be removing the same cache: what vanishes mid-walk is not counted.
    size = 0
    for root, _, files in os.walk(cache):
        for name in files:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, name)).st_size
    shutil.rmtree(cache, ignore_errors=True)
    return size


def prune_caches(study: optuna.Study, winner: FrozenTrial | None, run_dir: Path) -> int:
    """At the end of a study: the caches of its finished trials (and of the reference and the warm start)
    removed, the winner's kept; the bytes freed. A running trial's (another tuner's) is left alone."""
    keep = TrialRecord.of(winner).trial_dir if winner is not None else None
    dirs = {d for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            and (d := TrialRecord.of(t).trial_dir) and d != keep}
    dirs |= {str(d) for d in run_dir.glob("reference*")} | {str(run_dir / "warm_start")}
    freed = sum(drop_cache(d) for d in sorted(dirs))
    if freed:
        log.info("removed the trials' inductor caches (%.2f GiB); kept: the winner's%s and every trial's %s",
                 freed / 2**30, f" ({keep})" if keep else "", TRIAL_FILE)
    return freed
