"""The Optuna study: storage, sampler, what finished trials recorded, and recovery after a kill.

Each trial keeps its measurement in user attributes (``config``, ``identity``, ``result``...), so
a resumed study, a second tuner process, the report and MLflow all read the same record.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from filelock import FileLock
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.settings import ConfigError, Settings
from autocompile.study.records.compile_prior import prior_for, record_prior
from autocompile.study.records.record import Owner, TrialRecord

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

# The study's own attributes (Optuna study user attributes), one key each:
MEASURED_ON = "measured_on"
"""What every measurement shares (``Settings.measured_on``): a resumed study must match it."""
REFERENCE = "reference"
"""The numerics reference's result (``study/search/numerics.py``)."""
WARM_START = "warm_start"
"""The winner's warm start, measured once per winner (``study/search/warmstart.py``)."""
EXPECTED = "expected_s"
"""The estimate each time it was made (``before_search``, ``after_search``, ``after_confirm``): seconds per part
(``search``, ``confirm``, ``verdict``, ``warm_start``, ``total``) still to run then (``study/estimate.py``)."""
IN_FLIGHT = "in_flight"
"""The search's trial processes in flight per slot, as the tuner started them (``trial/slots.py:in_flight``): what
the estimate prices (``study/estimate.py``)."""
METHOD = {"confirm": "method.confirm", "verdict": "method.verdict"}
"""How each phase timed its candidates: ``{"method": Method, "why": ...}`` (``study/phases/together.py``)."""
NOT_ASKED = "verdict.not_asked"
"""The questions ``study.verdicts=auto`` left out at the winner: knob -> why it cannot change the recommendation."""
VERDICT_LOOK = "verdict.first_look"
"""After how many side-by-side processes the verdicts were read first (``statistics/decisions.py:
first_look``), set as the phase starts; absent: one look."""


def is_search(trial: FrozenTrial) -> bool:
    """A trial of the search (user attribute ``phase``; trials of older studies have none)."""
    return TrialRecord.of(trial).is_search


# -- Optuna without a public API for it (Optuna 5.0): the study's storage, a trial's id in it, and the
# storage's stale trials. tests/test_optuna_private.py fails when one of these names moves, and
# pyproject.toml bounds optuna to the major version they were checked on.

def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    return trial._trial_id


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Trials of ``study`` whose tuner stopped sending heartbeats (a database storage with heartbeats)."""
    return set(storage_of(study)._get_stale_trial_ids(study._study_id))


def beats(storage: optuna.storages.BaseStorage) -> bool:
    """The storage keeps heartbeats (a database URL with ``heartbeat_interval``): Optuna's
    ``is_heartbeat_enabled``, by the storage's public methods."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    return callable(interval) and callable(getattr(storage, "record_heartbeat", None)) and interval() is not None


RDB_SCHEMES = ("postgresql", "mysql", "sqlite", "oracle", "mssql")
SQLITE_HEADER = b"SQLite format 3\x00"


def journal_file(url: str, run_dir: Path) -> Path | None:
    """The journal file a ``study.storage`` names, absolute: the run directory's when empty, or a plain
    path (no URL scheme), as optuna-dashboard and Optuna's docs name one; None for a URL."""
    if not url:
        return (run_dir / "optuna.journal").resolve()
    return None if "://" in url else Path(url).expanduser().resolve()


def storage_for(url: str, run_dir: Path, heartbeat_s: int = 30) -> optuna.storages.BaseStorage:
    """The study's storage: a journal file (in the run directory unless a path is given) or a URL.

    Database URLs get Optuna heartbeats: a trial whose tuner stops beating (killed, node lost) is
    failed by whichever tuner notices, and its configuration queued again.
    """
    journal = journal_file(url, run_dir)
    try:
        if journal is not None:
            if not url:
                run_dir.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(check_journal(journal))))
        if url.split(":", 1)[0].split("+", 1)[0] in RDB_SCHEMES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat_s,
                                                  grace_period=3 * heartbeat_s)
        return optuna.storages.get_storage(url)
    except Exception as exc:
        raise ConfigError(f"study.storage={url or journal!s} cannot be opened "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                          "fix the path or URL, or leave it empty for a journal file in the run directory") from exc


def check_journal(path: Path) -> Path:
    """Not a SQLite database: appending journal records would corrupt it (optuna-dashboard refuses
    such a path the same way)."""
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                raise ValueError(f"{path} is a SQLite database: name it sqlite:///{path}")
    return path


def open_study(name: str, storage: optuna.storages.BaseStorage, directions: list[str],
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create or resume, with ``sampler`` (:func:`autocompile.study.search.samplers.make_sampler`; None:
    Optuna's default)."""
    study = optuna.create_study(study_name=name, storage=storage, directions=directions, sampler=sampler,
                                load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(f"study {name!r} exists with directions {[d.name.lower() for d in study.directions]}, "
                          f"not {directions}: keep its objective.kind or choose another study.name")
    return study


def check_measured_on(study: optuna.Study, measured_on: dict[str, Any], record: bool = True) -> None:
    """Refuse to resume a study on another workload than it measured; ``record`` it on a new one."""
    current = json.loads(json.dumps(measured_on))  # as stored: tuples become lists
    recorded = study.user_attrs.get(MEASURED_ON)
    if recorded is None:
        if record:
            study.set_user_attr(MEASURED_ON, current)
        return
    old, new = _dotted(recorded), _dotted(current)
    changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
               if old.get(k) != new.get(k)]
    if changed:
        raise ConfigError(f"study {study.study_name!r} was measured on another workload ({'; '.join(changed[:4])}): "
                          "restore those settings to resume it, or set study.name for a new study")


def open_for(settings: Settings, run_dir: Path, directions: list[str], sampler: optuna.samplers.BaseSampler
             ) -> optuna.Study:
    """The study in its storage, checked to be measured on this workload and machine, its compile prior fixed
    (:mod:`autocompile.study.records.compile_prior`), its dead trials recovered."""
    storage = storage_for(settings.study.storage, run_dir, settings.study.heartbeat_s)
    study = open_study(settings.study.name, storage, directions, sampler)
    check_measured_on(study, settings.measured_on())
    record_prior(study, prior_for(settings, run_dir))  # a resumed study keeps the prior it started with
    recover_interrupted(study)
    return study


def check_resumable(settings: Settings, run_dir: Path, opened: dict[str, optuna.storages.BaseStorage]) -> None:
    """Before anything starts: an existing study of this name must match the workload (read only).
    ``opened`` keeps the storages of earlier jobs of a sweep by URL: each is opened once."""
    url, name = settings.study.storage, settings.study.name
    journal = journal_file(url, run_dir)
    if journal is not None and not journal.is_file():
        if url and not journal.parent.is_dir():  # a mistyped path fails here, before anything starts
            raise ConfigError(f"study.storage={url} cannot be opened (no directory {journal.parent}): "
                              "create it or fix the path")
        return  # nothing to resume, and a check creates nothing
    key = url or str(run_dir)
    if key not in opened:
        opened[key] = storage_for(url, run_dir)
    if name in optuna.get_all_study_names(opened[key]):
        check_measured_on(optuna.load_study(study_name=name, storage=opened[key]), settings.measured_on(),
                          record=False)


def _dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def owner() -> Owner:
    return Owner(host=socket.gethostname(), pid=os.getpid(), pidns=pid_namespace())


def pid_namespace() -> int | None:
    """Containers on one host (``--network host``) share its hostname but not its pids."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def file_lock(path: Path) -> FileLock:
    """Exclusive across the processes of this machine (``flock``, through filelock): the kernel drops it when
    its holder dies, ``kill -9`` included, so a dead tuner never blocks the others. A context manager."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def is_orphaned(trial: FrozenTrial) -> bool:
    """A RUNNING trial whose tuner process is gone (same host and pid namespace, pid not alive)."""
    who = TrialRecord.of(trial).owner
    if not who or who.get("host") != socket.gethostname() or who.get("pidns", pid_namespace()) != pid_namespace():
        return False
    try:
        os.kill(int(who["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def measured_here(trial: FrozenTrial) -> bool:
    """A RUNNING trial whose tuner is alive on this machine (it shares the cores with ours)."""
    who = TrialRecord.of(trial).owner
    return bool(who) and who.get("host") == socket.gethostname() and \
        who.get("pidns", pid_namespace()) == pid_namespace() and not is_orphaned(trial)


def requeue(study: optuna.Study, trial: FrozenTrial | optuna.Trial, why: str) -> bool:
    """A trial whose tuner died: not counted, its configuration measured again (once). False when
    another tuner (or the trial's own) finished it first."""
    storage = storage_of(study)
    # Marked while still RUNNING (storages refuse to touch finished trials); idempotent, so tuners
    # that notice together agree. The state change is the claim: only its winner queues the retry.
    try:
        storage.set_trial_user_attr(trial_id(trial), "interrupted", True)
        storage.set_trial_user_attr(trial_id(trial), "reason", why)
        storage.set_trial_state_values(trial_id(trial), state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False  # finished meanwhile, by its tuner or by another one recovering it
    if trial.params:
        # A repeat of the confirmation or verdict phase stays that repeat (its phase, round, label...).
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number,
                                                      **TrialRecord.of(trial).kept_on_retry()})
    log.warning("trial %d was interrupted (%s): marked failed, configuration queued again", trial.number, why)
    return True


_RECOVERY = threading.Lock()  # slots of one tuner recover one at a time


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a dead tuner: fail them and queue their configuration again.

    On a database storage a dead tuner is one whose heartbeat went silent, whatever its host; on a
    journal file (one machine, no heartbeats) one whose pid is gone. Optuna's ``fail_stale_trials``
    is not used: it fails the trial before its callback runs, and a failed trial can no longer be
    marked as interrupted.
    """
    with _RECOVERY:
        if beats(storage_of(study)):
            dead, why = stale_trial_ids(study), "its tuner stopped sending heartbeats"
        else:
            dead, why = None, "its tuner process died during the trial"
        recovered = []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if trial_id(trial) in dead if dead is not None else is_orphaned(trial):
                requeue(study, trial, why)
                recovered.append(trial.number)
        return recovered


def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Callable[[], None]:
    """A beat to call while the trial runs (throttled); a no-op for storages without heartbeats."""
    storage = storage_of(study)
    if not beats(storage):
        return lambda: None
    period = storage.get_heartbeat_interval() / 2
    last = [0.0]

    def beat() -> None:
        if time.monotonic() - last[0] >= period:
            storage.record_heartbeat(trial_id(trial))
            last[0] = time.monotonic()

    return beat


CLAIM_LOCK = "claim.lock"
"""In the run directory: held while a search trial records its configuration and looks for a twin."""


def running_twin(study: optuna.Study, identity: str, number: int, field: str = "identity") -> FrozenTrial | None:
    """Another trial of the same configuration still running (another slot or tuner process) that claimed it
    first: the caller checks under :data:`CLAIM_LOCK` right after recording its own identity, so a trial it finds
    recorded its identity earlier, whatever their numbers. ``field="program"``: the same compiled program."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.number != number and getattr(TrialRecord.of(trial), field) == identity:
            return trial
    return None


def wait_finished(study: optuna.Study, number: int, patience_s: float, beat: Callable[[], None],
                  poll_s: float = 1.0, stop: threading.Event | None = None) -> FrozenTrial | None:
    """Trial ``number`` once it finished, or None if it still runs after ``patience_s`` (or ``stop`` is set).

    While waiting, the waiter keeps its own trial's heartbeat and recovers trials of dead tuners:
    the twin's tuner may be the one that died, and nobody else may be left to notice.
    """
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        trial = study.get_trials(deepcopy=False)[number]  # numbers are consecutive from 0
        if trial.state.is_finished():
            return trial
        beat()
        recover_interrupted(study)
        if (stop or threading.Event()).wait(poll_s):
            return None
    return None


def interrupted(trial: FrozenTrial) -> bool:
    """Failed because its tuner died or stopped. The mark alone is not enough: it is written before
    the state, and a late but live tuner may still have completed the trial."""
    return trial.state == TrialState.FAIL and TrialRecord.of(trial).interrupted


def counted(trial: FrozenTrial) -> bool:
    """Finished search trials count towards n_trials, except those a dead tuner interrupted (re-measured).
    Repeats of the confirmation and verdict phases have budgets of their own (study.repeats...)."""
    return trial.state in FINISHED and not interrupted(trial) and is_search(trial)


# Failures that may not happen again (a neighbour's load, the OOM killer): measured once more
# before they stand for the configuration.
TRANSIENT_FAILURES = ("timeout", "crash")


def find_measured(study: optuna.Study, identity: str, exclude: int) -> FrozenTrial | None:
    """A finished, measured trial of the same configuration (not a dedupe copy, not interrupted),
    unless its only measurement ended in a failure that may be transient."""
    same = [t for t in measured_trials(study) if t.number != exclude and TrialRecord.of(t).identity == identity]
    lasting = [t for t in same if TrialRecord.of(t).measured.failure not in TRANSIENT_FAILURES]
    return lasting[0] if lasting else same[1] if len(same) > 1 else None


def measured_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Finished search trials that carry a measurement of their own (duplicates, interruptions and
    the repeats of later phases left out: those are analysed as repeats, in ``racing``)."""
    found = []
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        record = TrialRecord.of(t)
        if record.result is not None and record.duplicate_of is None and record.is_search and not (
                t.state == TrialState.FAIL and record.interrupted):
            found.append(t)
    return found


def tell(study: optuna.Study, trial: optuna.Trial, state: TrialState, values: list[float] | None,
         constraints: dict[str, float] | None) -> None:
    if state == TrialState.COMPLETE:
        if constraints and TrialRecord.of(trial).constraints is None:
            for k, v in constraints.items():
                trial.set_constraint(k, v)
        study.tell(trial, values)
    else:
        study.tell(trial, state=state)


def feasible(trial: FrozenTrial) -> bool:
    """Within the memory limit and the loss tolerance (Optuna's convention: constraints <= 0)."""
    return all(v <= 0 for v in (TrialRecord.of(trial).constraints or {}).values())


def same_program(study: optuna.Study, fingerprint: str, exclude: int) -> FrozenTrial | None:
    """A complete, measured trial that compiled exactly this program (another configuration)."""
    for trial in measured_trials(study):
        if (trial.number != exclude and trial.state == TrialState.COMPLETE
                and TrialRecord.of(trial).measured.fingerprint == fingerprint):
            return trial
    return None
