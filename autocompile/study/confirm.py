"""The confirmation and verdict phases: measure again, in fresh processes, interleaved.

A search ranks configurations by one short measurement each, and one fresh process differs from the
next by more (6-16% on the project's 2-core VM) than most knobs change step time. So after the search:

1. **confirm** (racing, as irace and SMAC3's intensifier do): the best ``study.confirm_top``
   distinct programs and the baselines eager and default ``torch.compile(model)`` run again,
   ``study.repeats`` rounds, each round every candidate once, round-robin with a rotating start,
   so that drift of the machine hits every candidate alike;
2. **verdict**: the winner's one-knob neighbours, one per question (``study.verdicts``), again in
   rounds with the winner. A neighbour that compiles the winner's very program is stopped after
   its warm-up: "identical program", no repeats needed.

Every repeat is an Optuna trial (user attributes ``phase``, ``round``, ``label``), never deduped,
not counted in ``study.n_trials``. The plan is a function of the study's records, so a killed
study resumes where it stopped. With ``study.repeat_cache=warm`` a repeat reuses its configuration's
inductor cache (its search trial's, or a neighbour's first, cold, run): its steps are timed in a
fresh process after a cheap compile, and the compile time reported stays the cold measurement.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import statistics
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.knobs import KNOBS, KnobError, TrialConfig, describe
from autocompile.config.sections import Resources
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace, identity
from autocompile.study.objective import Objective
from autocompile.study.racing import phase_trials, step_time
from autocompile.study.reference import reference
from autocompile.study.shared import compact, feasible, heartbeat, measured_here, measured_trials, owner, tell
from autocompile.study.together import method
from autocompile.trial.launcher import INTERRUPT, Agents, Interrupted, launch
from autocompile.trial.slots import slot_threads

log = logging.getLogger(__name__)

Measure = Callable[[optuna.Trial], None]


@dataclass
class Slot:
    """One planned repeat: a configuration in one round of one phase."""

    phase: str
    round: int
    label: str
    params: dict[str, Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    """Further user attributes (candidate, cache_from, same_as, knob/value...)."""
    warm: bool = False
    """Times its steps with a warm cache (an earlier cold run of the same configuration exists)."""

    def key(self) -> tuple[str, int, str]:
        return (self.phase, self.round, self.label)


def key_of(trial: FrozenTrial) -> tuple[str, int, str] | None:
    a = trial.user_attrs
    return (a["phase"], a["round"], a["label"]) if "round" in a else None


def rotate(items: list[Any], r: int) -> list[Any]:
    """Round ``r``'s order: each candidate opens a round in turn (position effects average out)."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


# -- plans ---------------------------------------------------------------------------------------------

def confirm_plan(study: optuna.Study, objective: Objective, top: int, repeats: int) -> list[Slot]:
    """The best ``top`` distinct programs of the search and the eager / default-compile baselines."""
    ranked = sorted((t for t in measured_trials(study) if t.state == TrialState.COMPLETE and feasible(t)),
                    key=lambda t: objective.score(t.user_attrs["result"]))
    chosen: list[FrozenTrial] = []
    programs: set[str] = set()
    for t in ranked:
        fingerprint = t.user_attrs["result"].get("fingerprint") or t.user_attrs["identity"]
        if len(chosen) < top and fingerprint not in programs:
            chosen.append(t)
            programs.add(fingerprint)
    for t in ranked:
        if t.user_attrs.get("baseline") in ("eager", "compile") and t not in chosen:
            chosen.append(t)
    if len(chosen) < 2:
        return []  # nothing to race
    return [Slot("confirm", r, f"#{t.number}", t.params, {
        "candidate": t.number, "baseline": t.user_attrs.get("baseline"), "name": t.user_attrs.get("name", ""),
        "compile_s_cold": t.user_attrs["result"]["compile_s"], "cache_from": t.user_attrs["trial_dir"],
        "cold_trial": t.number,
    }, warm=True) for r in range(repeats) for t in rotate(chosen, r)]


def winner_trial(study: optuna.Study, objective: Objective) -> FrozenTrial | None:
    """The confirmed winner's search trial, or (no confirmation) the search's best."""
    from autocompile.study.racing import confirmed

    outcome = confirmed(study, objective)
    if outcome and outcome.get("winner"):
        return study.trials[outcome["winner"]["trial"]]
    ranked = sorted((t for t in measured_trials(study) if t.state == TrialState.COMPLETE and feasible(t)),
                    key=lambda t: objective.score(t.user_attrs["result"]))
    return ranked[0] if ranked else None


def neighbours(winner: FrozenTrial, space: SearchSpace, wanted: list[str] | None) -> list[tuple[str, Any, TrialConfig]]:
    """(knob, value, configuration) for every searched knob with a question, changed alone at the winner.

    A change that makes a later knob invalid (no configuration differs in that knob only) is left out."""
    env = space.env
    full = TrialConfig.from_flat(winner.user_attrs["config"], env, strict=False).flat()
    found = []
    values: dict[str, Any] = {}
    for key, (spec, _) in KNOBS.items():
        options = space.options(key, values)
        values[key] = full[key]
        if not spec.question or len(options) < 2 or (wanted is not None and key not in wanted):
            continue
        for value in options:
            if value == full[key]:
                continue
            try:
                found.append((key, value, TrialConfig.from_flat({**full, key: value}, env, strict=False)))
            except KnobError as exc:
                log.info("verdict %s=%s left out: %s", key, value, exc)
    return found


def verdict_plan(study: optuna.Study, winner: FrozenTrial, space: SearchSpace, wanted: list[str] | None,
                 repeats: int) -> list[Slot]:
    """Rounds of the winner and its neighbours; after round 0, neighbours found identical or failed drop out."""
    env = space.env
    first = {t.user_attrs["label"]: t for t in phase_trials(study, "verdict") if t.user_attrs["round"] == 0}
    members = [Slot("verdict", 0, "winner", winner.params, {
        "candidate": winner.number, "name": winner.user_attrs.get("name", ""),
        "compile_s_cold": winner.user_attrs["result"]["compile_s"], "cache_from": winner.user_attrs["trial_dir"]},
        warm=True)]
    for key, value, config in neighbours(winner, space, wanted):
        members.append(Slot("verdict", 0, f"{key}={value}", space.params(config.flat()), {
            "knob": key, "value": value, "reference": winner.user_attrs["config"].get(key, KNOBS[key][1]),
            "name": describe(config, env), "same_as": winner.user_attrs["result"].get("fingerprint"),
            "same_as_trial": winner.number}))
    plan = []
    for r in range(repeats):
        for m in rotate(members, r):
            if r > 0 and m.label != "winner":
                done = first.get(m.label)
                if done is not None and step_time(done) is None:
                    continue  # identical program, or failed: nothing to repeat
                m = Slot("verdict", r, m.label, m.params, {**m.attrs, "same_as": None,
                         "cache_from": done.user_attrs["trial_dir"] if done is not None else None}, warm=True)
            else:
                m = Slot("verdict", r, m.label, m.params, dict(m.attrs), warm=m.warm)
            plan.append(m)
    return plan


def cost_estimate(study: optuna.Study, plan: list[Slot], settings: Settings | None = None) -> float:
    """Seconds the plan will take, from the search's wall times: a cold run as a search trial took; a
    warm one without most of its compile time. Side by side (``settings`` given): per round, each
    candidate's warm start and the round's timing budget."""
    walls = [(r["wall_s"], r["compile_s"]) for t in measured_trials(study)
             if (r := t.user_attrs.get("result") or {}).get("status") == "ok" and "wall_s" in r]
    if not walls:
        return float("nan")
    cold = statistics.median(w for w, _ in walls)
    warm = statistics.median(max(w - c, 1.0) for w, c in walls)
    if settings is not None:
        rounds = len({slot.round for slot in plan})
        return sum(warm for _ in plan) + rounds * settings.compare.max_timed_s
    return sum(warm if slot.warm else cold for slot in plan)


def describe_plan(name: str, plan: list[Slot], seconds: float, side_by_side: bool = False) -> str:
    labels = list(dict.fromkeys(slot.label for slot in plan))
    rounds = len({slot.round for slot in plan})
    how = (f"side by side in {rounds} fresh processes (windows in rotating order)" if side_by_side else
           f"x up to {rounds} rounds = {len(plan)} runs in fresh processes, interleaved")
    return (f"{name} phase: {len(labels)} configurations {how}; expected about {seconds / 60:.1f} min: "
            f"{', '.join(labels)}")


# -- running a plan ------------------------------------------------------------------------------------

def run_plan(study: optuna.Study, plan: list[Slot], measure: Measure) -> None:
    """Measure every slot of ``plan`` not measured yet (a resumed study skips what it has)."""
    for slot in plan:
        while not slot_done(study, slot.key()):
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if not any(key_of(t) == slot.key() for t in waiting):
                study.enqueue_trial(slot.params, user_attrs={"phase": slot.phase, "round": slot.round,
                                                             "label": slot.label, **slot.attrs,
                                                             "method": method(study, slot.phase)["method"]})
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
                trial = study.ask()  # the oldest waiting trial: ours, or one an interruption queued again
            trial.set_user_attr("owner", owner())
            measure(trial)


def slot_done(study: optuna.Study, key: tuple[str, int, str]) -> bool:
    return any(key_of(t) == key for t in phase_trials(study, key[0]))


def measure_repeat(study: optuna.Study, trial: optuna.Trial, space: SearchSpace, objective: Objective,
                   settings: Settings, run_dir: Path, resources: Resources, agents: Agents) -> None:
    """One repeat: measured in a fresh process whatever was measured before (never deduped), unpruned.

    A verdict neighbour's first run is stopped once compiled if it compiled the winner's program."""
    attrs = trial.user_attrs
    config = space.sample(trial)
    trial.set_user_attr("config", config.active(space.env))
    trial.set_user_attr("identity", identity(config, space.env))
    trial.set_user_attr("name", describe(config, space.env))
    beat = heartbeat(study, trial)
    beat()
    trial_dir = run_dir / "trials" / f"{trial.number:04d}"
    trial.set_user_attr("trial_dir", str(trial_dir))
    cache = settings.cache_dir
    warm_from = Path(attrs["cache_from"]) / "inductor_cache" if attrs.get("cache_from") else None
    if cache is None and settings.study.repeat_cache == "warm" and warm_from is not None and warm_from.is_dir():
        cache = warm_from
    trial.set_user_attr("compile_cache", "none (eager)" if config.compile.scope == "none" else "shared warm"
                        if settings.cache_dir else "warm" if cache else "cold")
    same_as = attrs.get("same_as")

    def rule(events: list[dict[str, Any]], elapsed: float) -> tuple[str, str] | None:
        beat()
        compiled = next((e for e in events if e["event"] == "compiled"), None)
        if same_as and compiled and compiled["fingerprint"] == same_as:
            return ("same_program", f"compiled the winner's program (trial {attrs.get('same_as_trial')}), "
                                    f"fingerprint {same_as}")
        return None

    log.info("%s round %d: %s (trial %d, %s compile cache)", attrs["phase"], attrs["round"], attrs["label"],
             trial.number, trial.user_attrs["compile_cache"])
    result = launch(trial_dir, settings.trial_spec(config, slot_threads(settings, resources)), cache_dir=cache,
                    should_stop=rule, resources=resources, agents=agents)
    trial.set_user_attr("result", compact(result))
    if result["status"] == "same_program":
        trial.set_user_attr("same_program_as", attrs.get("same_as_trial"))
        trial.set_user_attr("reason", result["reason"])
        tell(study, trial, TrialState.PRUNED, None, None)
        return
    if result["status"] != "ok":
        trial.set_user_attr("reason", result.get("reason", ""))
        tell(study, trial, TrialState.FAIL, None, None)
        log.info("repeat %d %s: %s", trial.number, result["status"], result.get("reason"))
        return
    ref = reference(study)
    constraints = objective.constraints(result, ref["losses"] if ref else None)
    trial.set_user_attr("constraints", constraints)
    # Optuna's value uses the cold compile time: a warm repeat's compile is not what a new job pays.
    cold = attrs.get("compile_s_cold", result["compile_s"]) if cache is not None else result["compile_s"]
    tell(study, trial, TrialState.COMPLETE, objective.values({**result, "compile_s": cold}), constraints)


PHASE_LOCK = ".phases.lock"
"""In the run directory: one tuner of a shared study runs the phases, the others wait and report."""


@contextlib.contextmanager
def alone_on_the_machine(study: optuna.Study, run_dir: Path, interrupt: threading.Event = INTERRUPT,
                         poll_s: float = 1.0) -> Iterator[None]:
    """Hold the phases until no other tuner of this study measures anything here: repeats compared
    with each other must not share the cores with another repeat or a search trial. Tuners started
    together: the first to finish its search waits for the others' last trials, runs the phases,
    and the rest wait for it and then find every repeat done."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / PHASE_LOCK, "a") as handle:
        said = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said:
                    log.info("another tuner of this study is running its phases: waiting for it")
                    said = True
                if interrupt.wait(poll_s):
                    raise Interrupted("the tuner is stopping") from None
                continue
            break
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
            fcntl.flock(handle, fcntl.LOCK_UN)
