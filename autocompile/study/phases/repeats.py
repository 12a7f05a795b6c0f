"""Running a phase's plan (:mod:`autocompile.study.phases.plans`) in fresh processes: each slot an Optuna trial
measured and told, one repeat at a time, alone on the machine (no other tuner of the study measuring here)."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import optuna
from filelock import Timeout
from optuna.trial import TrialState

from autocompile.config.choices import compiles
from autocompile.config.sections import Resources
from autocompile.study.phases.plans import Slot, key_of
from autocompile.study.records.context import StudyContext
from autocompile.study.records.optuna_store import file_lock, measured_here, owner
from autocompile.study.records.phase_trials import method, phase_trials
from autocompile.study.records.record import TrialRecord, set_attrs, user_attrs
from autocompile.study.search.tell import Twin, begin, measure_and_tell
from autocompile.trial.launcher import INTERRUPT, Interrupted

log = logging.getLogger(__name__)

Measure = Callable[[optuna.Trial], None]
T = TypeVar("T")
R = TypeVar("R")



def fly(work: Callable[[T], R], items: list[T], in_flight: int) -> list[R]:
    """``work`` on each of ``items``, ``in_flight`` at a time (threads: each launches a process, which compiles beside
    the others and takes its turn on the device, :mod:`autocompile.trial.lease`); results in ``items``' order. Ctrl-C
    or an error stops the launches still in flight (they measured nothing) before it goes on up."""
    if in_flight <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(min(in_flight, len(items)), thread_name_prefix="flight") as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            return [future.result() for future in futures]
        except BaseException:
            INTERRUPT.set()  # the pool's exit waits for the others: their launches end now
            raise


def run_plan(study: optuna.Study, plan: list[Slot], measure: Measure, in_flight: int = 1) -> None:
    """Measure every slot of ``plan`` not measured yet (a resumed study skips what it has), ``in_flight`` at a
    time."""
    if in_flight > 1:
        _run_plan_in_flight(study, plan, measure, in_flight)
        return
    for slot in plan:
        while not slot_done(study, slot.key()):
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if not any(key_of(t) == slot.key() for t in waiting):
                study.enqueue_trial(slot.params, user_attrs=user_attrs(
                    phase=slot.phase, round=slot.round, label=slot.label,
                    **{**slot.attrs, "method": method(study, slot.phase)["method"]}))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
                trial = study.ask()  # the oldest waiting trial: ours, or one an interruption queued again
            set_attrs(trial, owner=owner())
            measure(trial)


def _run_plan_in_flight(study: optuna.Study, plan: list[Slot], measure: Measure, in_flight: int) -> None:
    """Every slot queued first, then ``in_flight`` workers ask and measure until none of it waits (a trial an
    interruption queued again is measured too, as one at a time does)."""
    lock = threading.Lock()
    with lock:
        busy = {key_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}
        for slot in plan:
            if not slot_done(study, slot.key()) and slot.key() not in busy:
                study.enqueue_trial(slot.params, user_attrs=user_attrs(
                    phase=slot.phase, round=slot.round, label=slot.label,
                    **{**slot.attrs, "method": method(study, slot.phase)["method"]}))

    def worker(_: int) -> None:
        while True:
            with lock:
                if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    return
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
                    trial = study.ask()
                set_attrs(trial, owner=owner())
            measure(trial)

    fly(worker, list(range(min(in_flight, len(plan)))), in_flight)


def slot_done(study: optuna.Study, key: tuple[str, int, str]) -> bool:
    return any(key_of(t) == key for t in phase_trials(study, key[0]))


def measure_repeat(ctx: StudyContext, trial: optuna.Trial, resources: Resources) -> None:
    """One repeat: measured in a fresh process whatever was measured before (never deduped), unpruned.

    A verdict neighbour's first run is stopped once compiled if it compiled the winner's program."""
    study, settings = ctx.study, ctx.settings
    config, beat = begin(study, trial, ctx.space)
    attrs = TrialRecord.of(trial)
    cache = settings.cache_dir
    warm_from = Path(attrs.cache_from) / "inductor_cache" if attrs.cache_from else None
    if cache is None and settings.study.repeat_cache == "warm" and warm_from is not None and warm_from.is_dir():
        cache = warm_from
    compile_cache = "none (eager)" if not compiles(config.compile.scope) else "shared warm" if settings.cache_dir \
        else "warm" if cache else "cold"
    set_attrs(trial, compile_cache=compile_cache)

    def twin_of(fingerprint: str) -> Twin | None:
        return Twin(attrs.same_as_trial, f"the winner's program (trial {attrs.same_as_trial})") \
            if fingerprint == attrs.same_as else None

    log.info("%s round %d: %s (trial %d, %s compile cache)", attrs.phase, attrs.round, attrs.label, trial.number,
             compile_cache)
    # Optuna's value uses the cold compile time: a warm repeat's compile is not what a new job pays.
    measure_and_tell(ctx, trial, config, beat, resources,
                     twin_of=twin_of if attrs.same_as else None, cache_dir=cache,
                     cold_compile_s=attrs.compile_s_cold if cache is not None else None, brief=attrs.cold_run)


PHASE_LOCK = ".phases.lock"
"""In the run directory: one tuner of a shared study runs the phases, the others wait and report."""


@contextlib.contextmanager
def alone_on_the_machine(study: optuna.Study, run_dir: Path, interrupt: threading.Event = INTERRUPT,
                         poll_s: float = 1.0) -> Iterator[None]:
    """Hold the phases until no other tuner of this study measures anything here: repeats compared
    with each other must not share the cores with another repeat or a search trial. Tuners started
    together: the first to finish its search waits for the others' last trials, runs the phases,
    and the rest wait for it and then find every repeat done."""
    lock = file_lock(run_dir / PHASE_LOCK)
    said = False
    while True:
        try:
            lock.acquire(timeout=0 if not said else poll_s)
            break
        except Timeout:
            if not said:
                log.info("another tuner of this study is running its phases: waiting for it")
                said = True
            if interrupt.is_set():
                raise Interrupted("the tuner is stopping") from None
    try:
        said = False
        while running := [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                          if measured_here(t)]:
            if not said:
                log.info("phases wait for trial(s) %s of another tuner to finish", running)
                said = True
            if interrupt.wait(poll_s):
                raise Interrupted("the tuner is stopping")
        yield
    finally:
        lock.release()
