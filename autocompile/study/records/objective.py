"""What "best" means: time to train a horizon, throughput, or the throughput/compile-time Pareto front.

Also the two pruning rules, as stop rules the launcher polls while a trial runs: a trial whose
warm-up (compile) alone already exceeds the best time-to-train, and a trial whose first timed
windows (the median of ``decisions.PRUNE_WINDOWS``) are clearly slower than the best. "Clearly" allows for
the noise of both sides and for the best being the minimum of ``k`` noisy measurements
(:func:`decisions.prune_margin`): a configuration no worse than the best is pruned with a chance of at most
``decisions.PRUNE_ALPHA`` (5%, one-sided). The noise is the largest of the study's run-to-run noise of alone
processes (``racing.study_noise``; until measured, the prior ``decisions.PRIOR_ALONE_NOISE``), the best's
window spread, and, for the windows' rule, how far windows stray from their process's level on this machine
now (:func:`decisions.window_spread` over the study's alone processes): on a machine whose speed moves by the
second, a challenger's windows taken at another moment than the best's move as much (a compile lasts
through many such moves, so the warm-up's rule leaves that term out).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from optuna.trial import FrozenTrial, TrialState

from autocompile.config.settings import ObjectiveSettings
from autocompile.study.records.record import Measurement, TrialRecord
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE, PRUNE_WINDOWS, prune_margin
from autocompile.trial.timing.result import ProgressEvent

DIRECTIONS = {
    "time_to_train": ["minimize"],
    "throughput": ["maximize"],
    "pareto": ["maximize", "minimize"],
}


def time_to_train(compile_s: float, step_s: float, horizon_steps: int) -> float:
    """Seconds to finish ``horizon_steps`` steps: compile once, then steady-state steps (the one formula)."""
    return compile_s + horizon_steps * step_s


class Objective:
    def __init__(self, settings: ObjectiveSettings) -> None:
        self.settings = settings
        self.kind = settings.kind

    @property
    def directions(self) -> list[str]:
        return DIRECTIONS[self.kind]

    @property
    def names(self) -> list[str]:
        return {"time_to_train": ["time_to_train_s"], "throughput": ["tokens_per_s"],
                "pareto": ["tokens_per_s", "compile_s"]}[self.kind]

    def time_to_train(self, result: Measurement) -> float:
        """Seconds to finish ``horizon_steps`` steps with this measurement's compile and step times."""
        return time_to_train(result.compile_s, result.step_s, self.settings.horizon_steps)

    def values(self, result: Measurement) -> list[float]:
        if self.kind == "time_to_train":
            return [self.time_to_train(result)]
        if self.kind == "throughput":
            return [result.tokens_per_s]
        return [result.tokens_per_s, result.compile_s]

    def score(self, result: Measurement) -> float:
        """One number where lower is better, to rank trials and prune against (Pareto: time to train)."""
        return -result.tokens_per_s if self.kind == "throughput" else self.time_to_train(result)

    def constraints(self, result: Measurement, reference_losses: list[float] | None) -> dict[str, float]:
        """Optuna constraints (feasible when <= 0): peak memory over the limit, loss drift over tolerance.

        Without reference losses the numerics are unchecked, which is never feasible: a trial that
        could not be compared with eager cannot win."""
        limit = self.settings.memory_limit_gb
        memory = (result.peak_memory_bytes or 0) / 2**30 - limit if limit > 0 else -1.0
        drift = loss_drift(result.losses or [], reference_losses, self.settings.loss_steps)
        numerics = drift - self.settings.loss_rtol if drift is not None else 1.0
        return {"memory_gb_over_limit": memory, "loss_drift_over_rtol": numerics}

    def stop_rule(self, best: tuple[int, Measurement] | None, noise: float | None = None,
                  k: int = 1, spread: float | None = None) -> PruneRule | None:
        """Prune against the best complete trial so far (its number and measurement); Pareto studies keep
        every trial.

        ``noise``: the study's run-to-run relative sd of step time in alone processes (None: not measured
        yet, the prior stands in); ``k``: how many complete trials the best is the best of; ``spread``: the
        windows' spread inside the study's alone processes (:func:`decisions.window_spread`)."""
        if best is None or self.kind == "pareto":
            return None
        number, measured = best
        cv = measured.step_s_cv or 0.0
        alone = max(noise if noise is not None else PRIOR_ALONE_NOISE, cv)
        # A compile lasts through many of the machine's moves; a few windows sit inside one.
        compile_margin = math.exp(prune_margin(alone, cv, k))
        sd = max(alone, spread or 0.0)
        margin = math.exp(prune_margin(sd, cv, k))
        best_score = self.score(measured)
        horizon = self.settings.horizon_steps
        evidence: dict[str, float] = {}
        warm_from: dict[str, float] = {}

        def stop(ratio: float, reason: str) -> str:
            evidence.update(ratio=ratio, margin=margin)  # the tuner keeps both: a near miss is measured again
            return reason

        def rule(events: list[ProgressEvent], elapsed: float) -> str | None:
            started = next((e for e in events if e["event"] == "warmup_start"), None)
            if started is None:
                return None
            warm = [e["seconds"] for e in events if e["event"] == "warmup_step"]
            windows = [e["step_s"] for e in events if e["event"] == "window"]
            if self.kind == "time_to_train" and not windows:
                # time to train = sum(warm-up) + (horizon - warm-up steps) x step >= time spent warming up;
                # ``elapsed`` leaves out what the lease paused (counted from when this rule first saw the warm-up:
                # a bound that can only come out low, never prune early)
                warm_from.setdefault("elapsed", elapsed)
                spent = elapsed - warm_from["elapsed"]
                if spent > best_score * compile_margin:
                    # Not provisional: the bound only grows while the warm-up goes on.
                    return (f"warm-up (compile) alone took {spent:.1f} s > best time to train "
                            f"{best_score:.1f} s (trial {number}, the best of {k}) by more than the noise allows "
                            f"(margin {compile_margin - 1:.0%})")
                return None
            if len(windows) < PRUNE_WINDOWS:
                return None
            step = statistics.median(windows[:PRUNE_WINDOWS])
            if self.kind == "time_to_train":
                bound = sum(warm) + (horizon - len(warm)) * step
                if bound > best_score * margin:
                    return stop(bound / best_score,
                                f"after the first {PRUNE_WINDOWS} timed windows: time to train ~{bound:.1f} s vs best "
                                f"{best_score:.1f} s (trial {number}, the best of {k}; margin {margin - 1:.0%} "
                                f"for noise {sd:.1%})")
            elif step > measured.step_s * margin:
                return stop(step / measured.step_s,
                            f"first {PRUNE_WINDOWS} timed windows {step * 1e3:.2f} ms/step vs best "
                            f"{measured.step_s * 1e3:.2f} ms (trial {number}, the best of {k}; margin "
                            f"{margin - 1:.0%} for noise {sd:.1%})")
            return None

        return PruneRule(rule, evidence)


class PruneRule:
    """A search trial's stop rule against the best so far, as the launcher calls it (``launcher.StopRule``), with
    its evidence once it stopped the trial on its windows: the ratio to the best and the margin it exceeded (the tuner
    keeps both: a near miss is measured again)."""

    def __init__(self, rule: Callable[[list[ProgressEvent], float], str | None], evidence: dict[str, float]) -> None:
        self.rule = rule
        self.evidence = evidence
        """Filled (``ratio``, ``margin``) when the rule stops the trial after its first windows."""

    def __call__(self, events: list[ProgressEvent], elapsed: float) -> str | None:
        return self.rule(events, elapsed)


class LatestBest:
    """A search trial's stop rule against the best so far while it runs, not only when it started: trials in
    flight together (``launch.concurrency``) finish while it compiles, and a best found meanwhile counts. The rule
    is built again (``build``) whenever ``changed`` says the complete trials changed."""

    def __init__(self, build: Callable[[], PruneRule | None], changed: Callable[[], object]) -> None:
        self.build, self.changed = build, changed
        self.key: object = None
        self.current: PruneRule | None = None
        self.built = False

    @property
    def evidence(self) -> dict[str, float]:
        return self.current.evidence if self.current is not None else {}

    def __call__(self, events: list[ProgressEvent], elapsed: float) -> str | None:
        key = self.changed()
        if not self.built or key != self.key:
            self.key, self.current, self.built = key, self.build(), True
        return self.current(events, elapsed) if self.current is not None else None


def loss_drift(losses: list[float], reference: list[float] | None, steps: int | None = None) -> float | None:
    """Largest relative distance between per-step losses over the first ``steps`` steps both ran."""
    if not reference or not losses:
        return None
    pairs = list(zip(losses[:steps], reference[:steps], strict=False))
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)


NEAR_MISS = 2.0
"""A pruned trial whose ratio to the best was within this many margins (in logs) is a near miss."""


def near_misses(trials: Sequence[FrozenTrial], limit: int) -> list[FrozenTrial]:
    """The pruned search trials to measure once more, closest to the bound first, at most ``limit`` in all: those
    measured once more already count (a resumed study picks no more than its first run could).

    A prune is a few first windows against the best so far, wrong for a configuration no worse than the best
    with a chance of up to ``decisions.PRUNE_ALPHA``; over a study's many prunes some are wrong, and a pruned
    trial never reaches the confirmation. So a prune is provisional: one whose evidence was near the margin
    (``prune_ratio`` within ``NEAR_MISS`` margins, in logs) is measured once more, under the same rule
    against the best of the whole search; a second prune is final (both wrong: about ``PRUNE_ALPHA``
    squared). A configuration already measured again, or a re-measurement itself, is not picked."""
    again = {TrialRecord.of(t).remeasure_of for t in trials} - {None}
    found = []
    for t in trials:
        record = TrialRecord.of(t)
        if (t.state != TrialState.PRUNED or not record.is_search or record.remeasure_of is not None
                or t.number in again or not record.prune_ratio or not record.prune_margin
                or record.prune_margin <= 1.0):
            continue
        excess = math.log(record.prune_ratio) / math.log(record.prune_margin)
        if excess <= NEAR_MISS:
            found.append((excess, t.number, t))
    return [t for _, _, t in sorted(found)[:max(limit - len(again), 0)]]
