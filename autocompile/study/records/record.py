"""What a trial recorded, typed: the Optuna user attributes of one trial and the measurement among them.

Every reader (the study loop, the phases, the report, MLflow) goes through :class:`TrialRecord` instead
of string keys. The stored shape does not change: each field is the user attribute of the same name,
and :class:`Measurement` is the ``result`` attribute, a subset of the worker's ``result.json``. So
journals and databases written before the record existed load as they are. An attribute that is
absent and one stored as null read alike (None); writing leaves None and the defaults out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar

from autocompile.config.choices import FRESH_PROCESSES, Knobs, Method
from autocompile.trial.timing.result import TrialResult

T = TypeVar("T")


def _from_mapping(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls`` from the keys of ``data`` it has fields for (unknown keys, from a newer version, ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names and v is not None})


def _to_mapping(obj: Any) -> dict[str, Any]:
    """The fields that say something: None and a field's default (False, "", ...) are left out."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value is None or value == default:
            continue
        out[f.name] = value.to_dict() if isinstance(value, Measurement) else value
    return out


MEASURED = ("status", "failure", "reason", "tokens_per_s", "throughput_unit", "step_s", "step_s_cv", "windows",
            "compile_s", "first_step_s", "peak_memory_bytes", "graph_count", "graph_breaks", "recompiles_timed", "mfu",
            "compiled", "wall_s", "losses", "tokens_per_s_windows", "environment", "fingerprint", "compiled_coverage",
            "step_s_windows", "step_cpu_s_windows", "rewarm_steps", "timed_precision", "timed_s", "side_by_side",
            "compile_cpu_s", "lease")
"""The fields of a process's :class:`TrialResult` kept on its trial (the ``result`` user attribute)."""


@dataclass
class Measurement(TrialResult):
    """What one run measured: the fields of its :class:`TrialResult` named in :data:`MEASURED`, kept on the trial for
    ranking, reporting and tracking (the trial directory's ``result.json`` has everything; every other field stays
    None here). Declared once, in ``TrialResult``; a record without a status is not ``ok``."""

    status: str = ""
    side_by_side: dict[str, int] | None = None
    """Side by side: ``round``, ``rounds`` and ``window_steps`` of the process that timed it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Measurement:
        """From a stored ``result`` attribute, or the worker's whole result (only the kept keys are read)."""
        return cls(**{k: v for k, v in (data or {}).items() if k in MEASURED and v is not None})

    @classmethod
    def of(cls, result: TrialResult) -> Measurement:
        """From a process's whole result (the fields kept on the trial)."""
        return cls.from_dict(result.to_json())

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in _to_mapping(self).items() if k in MEASURED}

    @property
    def unit(self) -> str:
        return self.throughput_unit or "tokens"


class Owner(TypedDict):
    """The process that runs a trial (the ``owner`` user attribute): another tuner finds a trial whose owner died."""

    host: str
    pid: int
    pidns: int | None
    """The pid namespace (containers on one host share its hostname, not its pids)."""


WARM_CACHES = ("warm", "shared warm")


@dataclass
class TrialRecord:
    """One trial's user attributes: what it is (configuration, phase, round...), what it measured, how it
    ended. Optuna's own fields (number, state, values, params) stay on the trial."""

    phase: str = "search"
    """``search``, ``confirm`` or ``verdict`` (trials of studies from before the phases have none: search)."""
    config: Knobs = field(default_factory=dict)
    """The active knobs, by dotted key (empty until the trial is sampled)."""
    identity: str | None = None
    """The configuration's identity within the workload (equal identities, the same configuration)."""
    name: str = ""
    """The knobs that differ from their defaults, for people."""
    owner: Owner | None = None
    """The tuner process that runs it: ``host``, ``pid``, ``pidns`` (found dead by pid on this host)."""
    baseline: str | None = None
    """``eager``, ``compile``... for a queued baseline (and its repeats), else None."""
    trial_dir: str | None = None
    """Where it ran (its spec, logs, progress and result.json); side by side, the round's process directory."""
    result: Measurement | None = None
    """What it measured (or what its duplicate's original measured); None before it ran."""
    constraints: dict[str, float] | None = None
    """Optuna constraints (feasible when all <= 0): ``memory_gb_over_limit``, ``loss_drift_over_rtol``."""
    numerics: str | None = None
    """``checked``, or why the losses were not compared with the eager reference."""
    reason: str | None = None
    """Why it failed, was pruned, copied or interrupted, in words."""
    duplicate_of: int | None = None
    """Not measured: the trial whose measurement stands for it (same configuration, or same program)."""
    same_program_as: int | None = None
    """Stopped once compiled: it compiled the program of this trial."""
    program: str | None = None
    """A running search trial's claim on the program it compiled (its fingerprint): a trial in flight that compiles
    the same program after it is stopped and waits for its measurement."""
    interrupted: bool = False
    """Its tuner died or stopped during it: failed, not counted, its configuration queued again."""
    retry_of: int | None = None
    """The interrupted trial it measures again."""
    round: int | None = None
    """A repeat's round (-1: a verdict neighbour's single cold run before the side-by-side rounds)."""
    label: str | None = None
    """A repeat's candidate within its phase: ``#N`` (confirm), ``winner`` or ``knob=value`` (verdict)."""
    candidate: int | None = None
    """Confirm: the search trial whose configuration it repeats."""
    compile_s_cold: float | None = None
    """A repeat's configuration's cold compile seconds (its search or first run): what reports show."""
    cache_from: str | None = None
    """The trial directory whose inductor cache a warm repeat reuses."""
    same_as: str | None = None
    """Verdict: the winner's program fingerprint; a neighbour that compiles it is stopped there."""
    same_as_trial: int | None = None
    """Verdict: the winner's search trial."""
    knob: str | None = None
    """Verdict: the knob this neighbour changes at the winner."""
    value: Any = None
    """Verdict: the knob's value in this neighbour."""
    reference: Any = None
    """Verdict: the knob's value at the winner."""
    method: Method = FRESH_PROCESSES
    """How a repeat was timed: ``fresh_processes`` (one process per run) or ``side_by_side``."""
    cold_trial: int | None = None
    """Side by side: the trial of its configuration's cold run (program, artifacts, compile time)."""
    cold_run: bool = False
    """Verdict side by side: a neighbour's single cold run (round -1), not a round."""
    cold_from: int | None = None
    """A cold run not run again: the search trial of the same configuration whose measurement it carries."""
    timed_in: str | None = None
    """Verdict: the confirmation candidate (``#N``) of this neighbour's configuration, timed beside the winner in
    every confirmation process: those processes are its rounds, and it joins no verdict process."""
    compile_cache: str | None = None
    """A repeat's inductor cache: ``cold``, ``warm``, ``shared warm``, ``none (eager)``, or side by side."""
    prune_ratio: float | None = None
    """Pruned: its first-window (or warm-up) time-to-train bound over the best's score when it was stopped."""
    prune_margin: float | None = None
    """Pruned: the ratio the rule needed (``decisions.prune_margin``, exponentiated) at that moment."""
    remeasure_of: int | None = None
    """A search trial measuring a near-miss prune's configuration once more (``tuner.provisional_prunes``)."""

    @classmethod
    def from_user_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        record = _from_mapping(cls, attrs)
        if attrs.get("result") is not None:
            record.result = Measurement.from_dict(attrs["result"])
        return record

    @classmethod
    def of(cls, trial: HasUserAttrs) -> TrialRecord:
        """The record of a trial (a FrozenTrial, a live Trial, anything with ``user_attrs``)."""
        return cls.from_user_attrs(trial.user_attrs)

    def to_user_attrs(self) -> dict[str, Any]:
        return _to_mapping(self)

    @classmethod
    def from_json(cls, text: str) -> TrialRecord:
        return cls.from_user_attrs(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.to_user_attrs(), sort_keys=True)

    @property
    def measured(self) -> Measurement:
        """``result``, or an empty measurement (status "") for a trial that has none yet."""
        return self.result if self.result is not None else Measurement()

    @property
    def is_search(self) -> bool:
        return self.phase == "search"

    @property
    def warm_repeat(self) -> bool:
        """A repeat of the phases timed after its configuration's warm inductor cache: its compile_s is not a
        cold compile (reports and tracking show its configuration's cold one, ``compile_s_cold``)."""
        return not self.is_search and self.compile_cache in WARM_CACHES

    @property
    def cold_compile_s(self) -> float | None:
        """The cold compile seconds of its configuration: its own, or a warm repeat's ``compile_s_cold``."""
        if self.warm_repeat and self.compile_s_cold is not None:
            return self.compile_s_cold
        return self.measured.compile_s

    def kept_on_retry(self) -> dict[str, Any]:
        """What a repeat of the phases is, kept when it is queued again after a kill (a search trial keeps
        its baseline name and configuration)."""
        attrs = self.to_user_attrs()
        return {k: attrs[k] for k in REPEAT_FIELDS if k in attrs}


REPEAT_FIELDS = ("baseline", "remeasure_of", "phase", "round", "label", "candidate", "name", "config",
                 "compile_s_cold", "cache_from", "same_as", "same_as_trial", "knob", "value", "reference", "method",
                 "cold_trial", "cold_run", "timed_in")
FIELDS = frozenset(f.name for f in dataclasses.fields(TrialRecord))


class HasUserAttrs(Protocol):
    user_attrs: dict[str, Any]


class SetsUserAttrs(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...


def set_attrs(trial: SetsUserAttrs, **fields: Any) -> None:
    """Write fields of ``trial``'s record, each as the user attribute of its name (a Measurement as a dict)."""
    for key, value in fields.items():
        if key not in FIELDS:
            raise KeyError(f"{key!r} is not a field of TrialRecord")
        trial.set_user_attr(key, value.to_dict() if isinstance(value, Measurement) else value)


def user_attrs(**fields: Any) -> dict[str, Any]:
    """User attributes for a trial to queue (``study.enqueue_trial``), by record field names."""
    unknown = set(fields) - FIELDS
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not fields of TrialRecord")
    return {k: v.to_dict() if isinstance(v, Measurement) else v for k, v in fields.items()}
