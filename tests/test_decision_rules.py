"""Each decision rule of the study against its nominal error rate or coverage, by simulation: the rules'
own pure functions on seeded noise (DESIGN.md section 10, issue 26). Each prints its figure (pytest -s)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

import optuna
import pytest
from optuna.trial import TrialState
from scipy import integrate, stats

from autocompile.config.knobs import Env
from autocompile.config.settings import ObjectiveSettings
from autocompile.config.space import SearchSpace
from autocompile.study.phases.plans import neighbours, recommended
from autocompile.study.phases.racing import compile_spread, verdicts
from autocompile.study.records.objective import Objective
from autocompile.study.records.record import Measurement
from autocompile.study.statistics.decisions import (
    PRUNE_WINDOWS,
    classify,
    expected_max_normal,
    holm,
    p_value,
    processes_to_decide,
    race,
    sd_bound,
    window_spread,
)
from autocompile.study.statistics.intervals import Ratio, level, paired_ratio, paired_windows, time_to_train
from autocompile.study.statistics.noise import pooled_noise

MARGIN = 0.02


def first_windows(*steps: float) -> list[dict[str, float | str]]:
    """A trial's events up to the windows the prune rule reads (one step time: that many windows of it)."""
    steps = steps * PRUNE_WINDOWS if len(steps) == 1 else steps
    return [{"event": "warmup_start", "time": 0.0}, *({"event": "window", "step_s": s} for s in steps)]


def mc_se(p: float, reps: int) -> float:
    """The Monte Carlo standard error of a rate ``p`` simulated ``reps`` times."""
    return math.sqrt(p * (1 - p) / reps)


def tost_power(delta: float, noise: float, n: int, margin: float = MARGIN) -> float:
    """The chance that ``n`` paired rounds of two programs ``delta`` apart on the log scale (each round's own
    log noise ``noise`` per program) give a 95 % t-interval inside +-log(1 + margin): the tie rule's exact rate,
    integrated from the normal mean and the chi-square sd, independently of the code under test."""
    sd, m = noise * math.sqrt(2), math.log1p(margin)
    se, t = sd / math.sqrt(n), stats.t.ppf(0.975, n - 1)

    def given(q: float) -> float:  # q = (n - 1) s^2 / sd^2, chi-square with n - 1 df
        half = t * sd * math.sqrt(q / (n - 1)) / math.sqrt(n)
        inside = stats.norm.cdf((m - half - delta) / se) - stats.norm.cdf((half - m - delta) / se)
        return max(inside, 0.0) * stats.chi2.pdf(q, n - 1)

    return integrate.quad(given, 0, stats.chi2.ppf(1 - 1e-9, n - 1), limit=200)[0]


def faster_power(delta: float, noise: float, n: int, margin: float = MARGIN) -> float:
    """The chance that ``n`` paired rounds of a rival ``delta`` faster than the incumbent classify it ``faster``:
    its 95 % t-interval below zero and not inside +-log(1 + margin) (that is a tie), integrated like
    :func:`tost_power`."""
    sd, m = noise * math.sqrt(2), math.log1p(margin)
    se, t = sd / math.sqrt(n), stats.t.ppf(0.975, n - 1)

    def given(q: float) -> float:
        half = t * sd * math.sqrt(q / (n - 1)) / math.sqrt(n)
        return stats.norm.cdf((min(-half, half - m) + delta) / se) * stats.chi2.pdf(q, n - 1)

    return integrate.quad(given, 0, stats.chi2.ppf(1 - 1e-9, n - 1), limit=200)[0]


def rounds(true: list[float], noise: float, n: int, rng: random.Random) -> list[dict[int, float]]:
    """Per candidate, round -> score: each round a fresh process per candidate (its own noise) on a machine
    whose speed drifts between rounds (shared by the round, cancelled by pairing)."""
    out: list[dict[int, float]] = [{} for _ in true]
    for r in range(n):
        machine = rng.gauss(0, 0.2)
        for c, t in enumerate(true):
            out[c][r] = math.exp(t + machine + rng.gauss(0, noise))
    return out


def old_race(means: list[float], simple: list[tuple[int, int]],
             versus: Callable[[int, int], Ratio | None]) -> int:
    """The rule before issue 26: every candidate whose interval against the leader contains zero ties."""
    leader = min(range(len(means)), key=lambda i: means[i])
    ties = [i for i in range(len(means)) if i == leader or not (r := versus(i, leader)) or not r.measurable]
    return min(ties, key=lambda i: (simple[i], means[i]))


def race_error(true: list[float], simple: list[tuple[int, int]], noise: float, n: int, reps: int = 2000,
               seed: int = 0) -> tuple[float, float, float]:
    """(new rule: decided and >= margin worse than the best; new rule: >= margin worse at all; old rule)."""
    rng = random.Random(seed)
    worse = [t - min(true) >= math.log1p(MARGIN) - 1e-12 for t in true]
    decided_wrong = wrong = old_wrong = 0
    for _ in range(reps):
        data = rounds(true, noise, n, rng)
        means = [statistics.fmean(map(math.log, d.values())) for d in data]

        def versus(i: int, j: int, data: list[dict[int, float]] = data) -> Ratio | None:
            return paired_ratio(data[i], data[j])

        outcome = race(means, simple, versus, MARGIN)
        wrong += worse[outcome.winner]
        decided_wrong += worse[outcome.winner] and outcome.decided
        old_wrong += worse[old_race(means, simple, versus)]
    return decided_wrong / reps, wrong / reps, old_wrong / reps


EAGER, COMPILE, FANCY = (0, 0), (1, 0), (1, 2)


@pytest.mark.parametrize(("true", "simple", "noise", "n"), [
    # issue 26: the fresh-process fallback at 8% noise, eager 20% slower, 3 rounds
    ([math.log(1.20), 0.0], [EAGER, COMPILE], 0.08, 3),
    # eager exactly at the margin, side-by-side-like noise: the hardest case for "tied"
    ([math.log1p(MARGIN), 0.0], [EAGER, COMPILE], 0.015, 5),
    # three candidates, the simpler two at and beyond the margin
    ([math.log1p(MARGIN), math.log1p(1.5 * MARGIN), 0.0], [EAGER, COMPILE, FANCY], 0.01, 5),
])
def test_a_tie_recommends_a_program_a_margin_worse_at_most_at_the_nominal_rate(
        true: list[float], simple: list[tuple[int, int]], noise: float, n: int) -> None:
    decided_wrong, wrong, old_wrong = race_error(true, simple, noise, n)
    print(f"\nties: noise {noise:.1%}, {n} rounds, {len(true)} candidates: decided and >= {MARGIN:.0%} worse "
          f"{decided_wrong:.2%} (nominal 5%; any recommendation {wrong:.2%}); old rule {old_wrong:.1%}")
    assert decided_wrong <= 0.05 and wrong <= 0.05
    if noise == 0.08:
        assert old_wrong > 0.3  # the old rule recommended the 20% slower eager most of the time
    if len(true) == 2 and true[0] == math.log1p(MARGIN):
        # Exactly at the margin the rule errs at its own level, not below it: a tie there is the interval
        # inside the margin by chance, 2.02 % (one side of the two one-sided tests at 2.5 %, the interval's
        # width estimated). A rule that never ties (0 %) or ties too easily fails this band.
        nominal = tost_power(true[0], noise, n)
        assert abs(decided_wrong - nominal) <= 3 * mc_se(nominal, 2000), (decided_wrong, nominal)


@pytest.mark.parametrize(("delta", "noise", "n"), [(0.0, 0.007, 5), (0.005, 0.005, 5)])
def test_a_tie_is_found_where_the_programs_are_within_the_margin(delta: float, noise: float, n: int) -> None:
    """The other side of the tie rule: its power. Two programs within the margin (the simpler ``delta``
    slower) are tied, and the simpler one recommended, as often as the exact two-one-sided-tests power says
    (Monte Carlo band of 3 standard errors); a rule that never ties recommends the simpler one only when it
    happens to lead (about half the time)."""
    rng = random.Random(5)
    reps, tied, simpler = 2000, 0, 0
    for _ in range(reps):
        data = rounds([delta, 0.0], noise, n, rng)
        means = [statistics.fmean(map(math.log, d.values())) for d in data]
        outcome = race(means, [EAGER, COMPILE], lambda i, j, data=data: paired_ratio(data[i], data[j]), MARGIN)
        tied += outcome.decided and "tied" in outcome.status
        simpler += outcome.winner == 0
    power = tost_power(delta, noise, n)
    print(f"\nties found: {delta:.1%} apart, noise {noise:.1%}, {n} rounds: tied {tied / reps:.1%}, the simpler "
          f"recommended {simpler / reps:.1%} (exact power {power:.1%})")
    assert abs(tied / reps - power) <= 3 * mc_se(power, reps) and power > 0.8
    assert simpler >= tied  # every tie recommends the simpler program
    # A clearly slower program (10 %, noise 1.5 %, 5 rounds) is decided: measurably slower, never recommended.
    slow = [rounds([0.1, 0.0], 0.015, 5, rng) for _ in range(200)]
    assert all(classify(paired_ratio(d[0], d[1]), MARGIN) == "slower" for d in slow)


@pytest.mark.parametrize("delta", [0.0, 0.01])
def test_a_known_winner_is_replaced_only_as_often_as_its_one_sided_test_says(delta: float) -> None:
    """The incumbent rule (re-verifying a known winner, ``study.reuse``): a rival ``delta`` faster replaces it when
    its interval lies below zero and outside the tie margin. Between equal programs that is under one side of a 95 %
    interval, 2.5 % (1.3 % here: below zero but within the margin is a tie), where the mean rule flips the
    recommendation about half the time; a truly faster rival replaces it as often as the
    exact rate says (:func:`faster_power`; Monte Carlo band of 3 standard errors)."""
    rng = random.Random(11)
    reps, noise, n, replaced, flipped = 2000, 0.01, 5, 0, 0
    for _ in range(reps):
        data = rounds([0.0, -delta], noise, n, rng)  # 0: the incumbent, 1: the rival
        means = [statistics.fmean(map(math.log, d.values())) for d in data]

        def versus(i: int, j: int, data: list[dict[int, float]] = data) -> Ratio | None:
            return paired_ratio(data[i], data[j])

        replaced += race(means, [COMPILE, FANCY], versus, MARGIN, incumbent=0).leader != 0
        flipped += race(means, [COMPILE, FANCY], versus, MARGIN).leader != 0
    nominal = faster_power(delta, noise, n)
    print(f"\nincumbent: rival {delta:.1%} faster, noise {noise:.1%}, {n} rounds: replaced {replaced / reps:.2%} "
          f"(exact {nominal:.2%}); the mean rule flips {flipped / reps:.1%}")
    assert abs(replaced / reps - nominal) <= 3 * mc_se(nominal, reps)
    if delta == 0.0:
        assert nominal <= 0.025 and flipped / reps > 0.4


@pytest.mark.parametrize("n0", [3, 7])
def test_undetermined_says_how_many_processes_would_decide_and_they_do(n0: int) -> None:
    # A 0.5% difference measured in n0 rounds at 2% noise is undetermined; a study that then runs as many
    # processes as it names decides at least 80 % of the time, as it says. With the measured difference and sd
    # at face value it decided 60.1 % from 3 rounds (the sd of 2 df is under the truth more often than not);
    # planning on the sd's upper bound (decisions.sd_bound) decides 79.8 % from 3 rounds and 85.7 % from 7.
    rng = random.Random(0)
    true, reps, decided, named = [0.005, 0.0], 2000, 0, []
    for _ in range(reps):
        first = rounds(true, 0.02, n0, rng)
        ratio = paired_ratio(first[0], first[1])
        if classify(ratio, MARGIN) != "undetermined":
            continue
        more = processes_to_decide(ratio, MARGIN, n0)
        if more is None:
            continue
        named.append(more)
        again = rounds(true, 0.02, n0 + more, rng)
        decided += classify(paired_ratio(again[0], again[1]), MARGIN) != "undetermined"
    rate = decided / len(named)
    print(f"\nundetermined after {n0} rounds: a median of {statistics.median(named)} more processes named; a study "
          f"of that size decided {rate:.1%} of the time ({len(named)} studies; 80% named)")
    assert len(named) > reps / 2 and 0.8 - 3 * mc_se(0.8, len(named)) <= rate <= 0.95
    assert processes_to_decide(None, MARGIN, n0) is None


@pytest.mark.parametrize(("delta", "noise"), [(0.03, 0.02), (0.05, 0.03)])
def test_the_processes_named_give_80_percent_power_at_the_true_difference(delta: float, noise: float) -> None:
    """The planner's design: given the true difference and noise (an interval of 3 rounds at its expected
    width), the number of processes it names has at least 80 % power by the noncentral t (at most the
    smallest such size times the price of planning on a sd of 2 df), and a simulated study of that size decides
    "measurably slower" as often as the noncentral t says (3 Monte Carlo standard errors, about +-2 %)."""
    n0, sd = 3, noise * math.sqrt(2)
    half = stats.t.ppf(0.975, n0 - 1) * sd / math.sqrt(n0)
    n = n0 + processes_to_decide(Ratio(math.expm1(delta), math.expm1(delta - half), math.expm1(delta + half), n0),
                                 MARGIN, n0)

    def power(k: int) -> float:
        return float(stats.nct.sf(stats.t.ppf(0.975, k - 1), k - 1, delta * math.sqrt(k) / sd))

    # The smallest size with 80 % power, and what the plan adds for planning on a sd of 2 df (sd_bound(2)**2):
    # never below the power it names, never past that price.
    smallest = next(k for k in range(n0, 10 * n) if power(k) >= 0.8)
    assert power(n) >= 0.8 and n <= math.ceil(smallest * sd_bound(n0 - 1) ** 2) + 1, (n, smallest, power(n))
    rng, reps = random.Random(0), 3000
    slower = sum(classify(paired_ratio(*rounds([delta, 0.0], noise, n, rng)), MARGIN) == "slower"
                 for _ in range(reps))
    print(f"\nplanned: {delta:.0%} apart at noise {noise:.0%}: {n} processes, decided {slower / reps:.1%} "
          f"(noncentral t {power(n):.1%})")
    assert abs(slower / reps - power(n)) <= 3 * mc_se(power(n), reps)


def test_pruning_a_configuration_no_worse_than_the_best_stays_under_its_nominal_rate() -> None:
    # k configurations measured once each, all as good as the challenger (the best is a lucky minimum), or
    # the challenger 3.4% better than all; alone noise 6.7-8.6%, a first window's own 3% spread.
    rng = random.Random(0)
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    results = {}
    for noise, k, gain, measured in [(0.086, 5, 0.0, True), (0.086, 8, 0.034, True), (0.067, 3, 0.0, False),
                                     (0.067, 8, 0.0, False)]:
        pruned = old = 0
        reps = 1500
        for _ in range(reps):
            best = min(0.010 * math.exp(rng.gauss(0, noise)) for _ in range(k))
            window = 0.010 * (1 - gain) * math.exp(rng.gauss(0, noise) + rng.gauss(0, 0.03))
            rule = throughput.stop_rule((0, Measurement(status="ok", step_s=best, step_s_cv=0.03, tokens_per_s=1.0)),
                                        noise if measured else None, k)
            pruned += rule(first_windows(window), 1.0) is not None
            old_margin = 1 + max(0.10, 3 * (noise if measured else 0.03))
            old += window > best * old_margin
        results[(noise, k, gain, measured)] = (pruned / reps, old / reps)
        print(f"\nprune: noise {noise:.1%} ({'measured' if measured else 'prior'}), best of {k}, challenger "
              f"{gain:.1%} better: pruned {pruned / reps:.2%} (nominal 5%); old rule {old / reps:.1%}")
    assert all(new <= 0.05 for new, _ in results.values())
    assert results[(0.067, 8, 0.0, False)][1] > 0.15  # the old 10% margin against a lucky minimum


@pytest.mark.parametrize(("slower", "nominal"), [(0.0, 0.05), (2.486, 0.80)])
def test_pruning_against_one_measurement_errs_at_its_level_and_stops_a_slower_one_at_its_power(
        slower: float, nominal: float) -> None:
    """Both sides of the prune rule where its rate is exact: the best is one measurement (k = 1, no luck to
    allow for), so the log-ratio of the challenger's first window to the best is normal with sd
    sqrt(2 noise^2 + window cv^2), and the rule prunes beyond its one-sided 95 % quantile. A challenger no worse
    is pruned 5 % of the time; one ``slower`` sds slower (z(0.95) + z(0.8)) is pruned 80 % of the time. Within
    3 Monte Carlo standard errors: a rule that never prunes, or prunes at a fixed 10 %, fails one side."""
    rng = random.Random(2)
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    noise, cv, reps, pruned = 0.086, 0.03, 4000, 0
    shift = slower * math.sqrt(2 * noise**2 + cv**2)
    for _ in range(reps):
        best = 0.010 * math.exp(rng.gauss(0, noise))
        window = 0.010 * math.exp(shift + rng.gauss(0, noise) + rng.gauss(0, cv))
        rule = throughput.stop_rule((0, Measurement(status="ok", step_s=best, step_s_cv=cv, tokens_per_s=1.0)),
                                    noise, 1)
        pruned += rule(first_windows(window), 1.0) is not None
    print(f"\nprune, best of 1: challenger {math.expm1(shift):.0%} slower pruned {pruned / reps:.2%} "
          f"(exact {nominal:.0%})")
    assert abs(pruned / reps - nominal) <= 3 * mc_se(nominal, reps)


def run_windows(rng: random.Random, sd: float, windows: int | None = None) -> list[float]:
    """One alone process of a program stepping 10 ms on a machine whose speed moves by the second: its level
    holds for an exponential while (mean 2 s) then jumps (log sd ``sd``; a process starts at an independent
    moment), each 0.1 s window adds 3 % of its own and one in 50 stalls at 2x. ``windows``: that many, else
    the worker's rule (5 at least, then until +-2 % or 10 s)."""
    level, left, out, total, squares = rng.gauss(0, sd), rng.expovariate(0.5), [], 0.0, 0.0
    while True:
        if left <= 0:
            level, left = rng.gauss(0, sd), rng.expovariate(0.5)
        stall = 2.0 if rng.random() < 0.02 else 1.0
        out.append(w := 0.010 * stall * math.exp(level + rng.gauss(0, 0.03)))
        left, total, squares, n = left - 0.1, total + w, squares + w * w, len(out)
        if windows is not None:
            if n == windows:
                return out
        elif n >= 5 and (n >= 100 or 1.96 * math.sqrt(max(0.0, squares - total * total / n) / (n - 1) / n)
                         <= 0.02 * total / n):
            return out


@pytest.mark.parametrize("sd", [0.0, 0.10, 0.25])
def test_pruning_on_a_machine_whose_speed_moves_stays_under_its_nominal_rate(sd: float) -> None:
    """The issue-35 study on the 2-core VM pruned 6 of 12 trials, among them the program it later measured
    best (its first window 24.3 ms, 15.1 ms in a second process), while the reference's windows ran 15-36 ms:
    the machine's speed moved by the second, which the 8.6 % prior of alone processes does not know. With the
    machine's moves read from the study's own alone processes (``decisions.window_spread``) and the median of
    the first ``PRUNE_WINDOWS`` windows, a challenger no worse than the best of 4 (each measured as the worker
    does, beside a 10 s numerics reference) is pruned at most 5 % of the time (3 Monte Carlo errors); the rule
    of one window and the prior alone errs far more once the machine moves; a 2x slower one is still pruned
    on a steady machine."""
    rng = random.Random(11)
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    reps, k = 1500, 4
    pruned = old = slower = 0
    for _ in range(reps):
        runs = [run_windows(rng, sd) for _ in range(k)]
        reference = run_windows(rng, sd, 100)
        best = min(statistics.median(r) for r in runs)
        cv = [(statistics.pstdev(r) / statistics.fmean(r), len(r)) for r in [*runs, reference]]
        measured = Measurement(status="ok", step_s=best, step_s_cv=cv[0][0], tokens_per_s=1.0)
        rule = throughput.stop_rule((0, measured), None, k, window_spread(cv))
        challenger = run_windows(rng, sd, PRUNE_WINDOWS)
        pruned += rule(first_windows(*challenger), 1.0) is not None
        slower += rule(first_windows(*(2 * w for w in challenger)), 1.0) is not None
        before = throughput.stop_rule((0, measured), None, k)  # the rule of one window and the prior
        old += before(first_windows(challenger[0]), 1.0) is not None
    print(f"\nprune on a machine moving {sd:.0%}: no worse pruned {pruned / reps:.2%} (nominal 5%; one window and "
          f"the prior {old / reps:.2%}); 2x slower pruned {slower / reps:.1%}")
    assert pruned / reps <= 0.05 + 3 * mc_se(0.05, reps)
    if sd >= 0.25:
        assert old / reps > 0.15
    if sd == 0.0:
        assert slower / reps > 0.9  # the stalls in the pooled spread cost a little power


def test_pruning_still_stops_a_clearly_slower_configuration() -> None:
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    rule = throughput.stop_rule((0, Measurement(status="ok", step_s=0.010, step_s_cv=0.03, tokens_per_s=1.0)), 0.05,
                                5)
    assert "best of 5" in rule(first_windows(0.020), 1.0)
    assert expected_max_normal(1) == 0.0 and 1.1 < expected_max_normal(5) < 1.2  # exact: 1.163


def test_a_near_miss_prune_is_measured_again_and_a_good_configuration_survives_it() -> None:
    """Pruning is provisional (``objective.near_misses``): a prune near the margin is measured once more against
    the best. Over a study, a configuration 3.4% better than everything measured before it (alone noise 8.6%,
    best of 8) is lost for good far less often than with one window deciding."""
    import optuna

    from autocompile.study.records.objective import near_misses

    rng = random.Random(1)
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    noise, k, gain, reps = 0.086, 8, 0.034, 3000
    once = final = 0
    for _ in range(reps):
        best = min(0.010 * math.exp(rng.gauss(0, noise)) for _ in range(k))
        rule = throughput.stop_rule((0, Measurement(status="ok", step_s=best, step_s_cv=0.03, tokens_per_s=1.0)),
                                    noise, k)

        def window() -> list[dict[str, float | str]]:
            step = 0.010 * (1 - gain) * math.exp(rng.gauss(0, noise) + rng.gauss(0, 0.03))
            return first_windows(step)

        if rule(window(), 1.0) is None:
            continue
        once += 1
        ratio, margin = rule.evidence["ratio"], rule.evidence["margin"]  # type: ignore[attr-defined]
        near = math.log(ratio) <= 2.0 * math.log(margin)
        final += not near or rule(window(), 1.0) is not None
    print(f"\nprune of a 3.4% better configuration (noise 8.6%, best of 8): lost {once / reps:.2%} on one window, "
          f"{final / reps:.2%} after a near miss is measured again (nominal 5% for one no worse than the best)")
    assert final < once / 3 and final / reps <= 0.02

    # The selection: pruned search trials near the margin, closest first, never twice, never a re-measurement.
    study = optuna.create_study()
    for ratio, attrs in [(1.30, {}), (1.12, {}), (1.25, {}), (1.11, {"remeasure_of": 0}), (1.05, {"phase": "verdict"})]:
        trial = study.ask()
        for key, value in {"prune_ratio": ratio, "prune_margin": 1.12, **attrs}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    picked = [t.number for t in near_misses(study.trials, 5)]
    assert picked == [1, 2]  # 1.30 > 1.12^2; trial 0 was measured again (by 3); 3 is a re-measurement; 4 a verdict
    # The limit counts what was measured once more already (trial 0, by 3): a resumed study picks no more.
    assert [t.number for t in near_misses(study.trials, 2)] == [1] and near_misses(study.trials, 1) == []


def test_holm_keeps_the_chance_of_one_false_measurably_among_the_neighbours_at_5_percent() -> None:
    """Holm's step-down rejects anything only when the smallest p-value is under 5 % / m: with m = 6 such
    tests that share the winner's noise the family-wise rate lies between 5 % / 6 (perfectly correlated) and
    1 - (1 - 5 % / 6)^6 = 4.9 % (independent). 10 000 studies pin it to +-0.2 % (one Monte Carlo error):
    4.65 %. The 5.35 % once printed was 2 000 studies, one Monte Carlo error (0.5 %) from this."""
    rng = random.Random(0)
    m, reps, n = 6, 10000, 3
    any_holm = any_raw = 0
    for _ in range(reps):
        data = rounds([0.0] * (m + 1), 0.05, n, rng)  # the winner and m neighbours of no effect
        ratios = [paired_ratio(data[i], data[0]) for i in range(1, m + 1)]  # all against one winner: correlated
        any_holm += any(holm([p_value(r) for r in ratios]))
        any_raw += any(r.measurable for r in ratios)
    print(f"\nverdicts: {m} neighbours of no effect, {n} rounds: >= 1 false 'measurably' {any_holm / reps:.2%} "
          f"with Holm (nominal 5%), {any_raw / reps:.1%} uncorrected")
    independent = 1 - (1 - 0.05 / m) ** m
    assert 0.035 <= any_holm / reps <= independent + 2 * mc_se(independent, reps)
    assert any_raw / reps > 0.1


def test_holm_finds_a_neighbour_with_a_real_effect_at_least_as_often_as_bonferroni() -> None:
    """Holm's power: among 6 neighbours, one 15 % slower (10 rounds, 5 % noise) is declared measurably
    different at least as often as Bonferroni's test at 5 % / 6 would by the noncentral t (3 Monte Carlo
    standard errors); a Holm that never rejects fails."""
    rng = random.Random(4)
    m, reps, n, effect = 6, 1000, 10, math.log(1.15)
    found = 0
    for _ in range(reps):
        data = rounds([0.0, effect] + [0.0] * (m - 1), 0.05, n, rng)
        found += holm([p_value(paired_ratio(data[i], data[0])) for i in range(1, m + 1)])[0]
    ncp = effect * math.sqrt(n) / (0.05 * math.sqrt(2))
    bonferroni = float(stats.nct.sf(stats.t.ppf(1 - 0.05 / m / 2, n - 1), n - 1, ncp))
    print(f"\nHolm's power: a 15% effect among {m} found {found / reps:.1%} (Bonferroni {bonferroni:.1%})")
    assert found / reps >= bonferroni - 3 * mc_se(bonferroni, reps) and bonferroni > 0.5


def test_holm_rejects_step_down() -> None:
    assert holm([0.001, 0.04, 0.03, None]) == [True, False, False, False]  # 0.03 > 0.05 / 2
    assert holm([0.001, 0.02, 0.04]) == [True, True, True]  # 0.02 <= 0.05 / 2, 0.04 <= 0.05 / 1
    assert holm([None, None]) == [False, False]


def sbs_windows(rng: random.Random, ratio: float, processes: int = 5, windows: int = 30, noise: float = 0.02,
                process_sd: float = 0.005) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    a, b = {}, {}
    for p in range(processes):
        level, own = rng.gauss(0, 0.1), rng.gauss(0, process_sd)
        a[p] = [0.010 * math.exp(level + rng.gauss(0, noise)) for _ in range(windows)]
        b[p] = [0.010 * ratio * math.exp(level + own + rng.gauss(0, noise)) for _ in range(windows)]
    return a, b


def geomean(per_process: dict[int, list[float]]) -> float:
    return math.exp(statistics.fmean(math.log(x) for w in per_process.values() for x in w))


def test_the_time_to_train_interval_covers_the_truth_with_the_compile_spread_measured_in_the_study() -> None:
    rng = random.Random(0)
    horizon, cv, reps = 2000, 0.05, 1000  # 20 s of steps against 20-30 s of compile: the compile matters
    ca, cb, ratio = 20.0, 30.0, 0.90
    truth = math.log((cb + horizon * 0.010 * ratio) / (ca + horizon * 0.010))
    cover = {"measured": 0, "prior 0.15": 0}
    width = {"measured": 0.0, "prior 0.15": 0.0}
    for _ in range(reps):
        a, b = sbs_windows(rng, ratio, windows=10)
        step = paired_windows(a, b)
        spread = pooled_noise([[math.exp(rng.gauss(0, cv)) for _ in range(3)] for _ in range(2)], "")  # 4 df
        sides = ((geomean(a), ca * math.exp(rng.gauss(0, cv))), (geomean(b), cb * math.exp(rng.gauss(0, cv))))
        for name, (sd, df) in (("measured", (spread.rel_sd, spread.df)), ("prior 0.15", (0.15, 4))):
            ttt = time_to_train(step, *sides, horizon, sd, df, step_level=level(a))
            cover[name] += math.log1p(ttt.low) <= truth <= math.log1p(ttt.high)
            width[name] += (ttt.high - ttt.low) / 2 / reps
    print(f"\ntime to train: coverage {cover['measured'] / reps:.1%} (nominal 95%), half-width "
          f"{width['measured']:.1%} with the measured spread (true 5%, 4 df); the fixed 0.15: "
          f"{cover['prior 0.15'] / reps:.1%}, half-width {width['prior 0.15']:.1%}")
    assert 0.93 <= cover["measured"] / reps <= 0.97  # nominal, within 2 Monte Carlo se (0.7%)
    assert width["prior 0.15"] > 2 * width["measured"]


def test_an_a_a_comparison_counts_its_one_cold_run_once() -> None:
    rng = random.Random(1)
    reps, covered, widths, half_widths = 600, 0, [], []
    for _ in range(reps):
        a, b = sbs_windows(rng, 1.0, windows=10)
        step = paired_windows(a, b)
        cold = 20.0 * math.exp(rng.gauss(0, 0.05))
        shared = time_to_train(step, (geomean(a), cold), (geomean(b), cold), 2000, 0.05, 4, shared_cold=True)
        apart = time_to_train(step, (geomean(a), cold), (geomean(b), cold), 2000, 0.05, 4)
        covered += shared.low <= 0 <= shared.high
        widths.append((shared.high - shared.low) / (apart.high - apart.low))
        half_widths.append((shared.high - shared.low) / 2)
    print(f"\nA/A: coverage {covered / reps:.1%} (nominal 95%); half-width {statistics.fmean(widths):.0%} of the "
          "double-counted one")
    assert covered / reps >= 0.93 and statistics.fmean(widths) < 0.6
    # And not by width alone: the steps' share (20 s of 40 s) of the process-means interval of the step ratio,
    # t(4) x sqrt((process sd^2 + 2 x window sd^2 / 10 windows) / 5 processes), is +-0.64 %; an interval
    # that covers by being wide fails.
    ideal = stats.t.ppf(0.975, 4) * math.sqrt((0.005**2 + 2 * 0.02**2 / 10) / 5) * 20 / (20 + 20)
    assert statistics.fmean(half_widths) <= 1.25 * ideal, (statistics.fmean(half_widths), ideal)


def test_the_compile_spread_pools_what_the_study_measured_with_the_prior_by_df_else_the_prior_says_so() -> None:
    settings = ObjectiveSettings()
    study = optuna.create_study()
    for fp, seconds in (("p1", 20.0), ("p1", 21.0), ("p2", 30.0), ("e", 0.1), ("e", 0.3)):
        scope = "none" if fp == "e" else "module"
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
            "phase": "search", "config": {"compile.scope": scope}, "identity": fp,
            "result": {"status": "ok", "step_s": 0.01, "compile_s": seconds, "fingerprint": fp}}))
    spread = compile_spread(study, settings)
    measured = abs(math.log(21 / 20)) / math.sqrt(2)  # eager's tenths of a second are no compile
    assert spread.measured_df == 1 and spread.measured_cv == pytest.approx(measured)
    # Issue 50: pooled with the CPU class's prior (10 %, 8 df), weighted by df, never replaced by 1 df.
    assert spread.df == 9 and spread.cv == pytest.approx(math.sqrt((8 * 0.10**2 + measured**2) / 9))
    assert "prior 10.0% on 8 df" in spread.source and "pooled with the study's 3.4% on 1 df" in spread.source
    prior = compile_spread(study, settings, shared_cache=True)
    assert (prior.cv, prior.df, prior.measured_cv) == (0.10, 8, None)
    assert "no program was compiled cold twice" in prior.source


def test_stalls_told_by_cpu_time_keep_the_programs_own_slow_windows() -> None:
    from autocompile.trial.timing.stats import descheduled

    rng = random.Random(0)
    reps, windows, processes = 300, 40, 5
    truth = 0.05 * math.log(1.6)  # b's own: 5% of its windows at 1.6x (the expected mean log-ratio)
    cover = {"cpu": 0, "wall": 0}
    half_cpu = 0.0
    for _ in range(reps):
        a, b, ca, cb = {}, {}, {}, {}
        for p in range(processes):
            a[p], b[p], ca[p], cb[p] = [], [], [], []
            for _ in range(windows):
                wa = 0.010 * math.exp(rng.gauss(0, 0.02))
                wb = 0.010 * math.exp(rng.gauss(0, 0.02)) * (1.6 if rng.random() < 0.05 else 1.0)
                ua, ub = 1.9 * wa * math.exp(rng.gauss(0, 0.01)), 1.9 * wb * math.exp(rng.gauss(0, 0.01))
                if rng.random() < 0.02:  # descheduled: wall time passes, CPU time does not
                    wa *= 3
                if rng.random() < 0.02:
                    wb *= 3
                a[p].append(wa), b[p].append(wb), ca[p].append(ua), cb[p].append(ub)
        for name, ratio in (("cpu", paired_windows(a, b, ca, cb)), ("wall", paired_windows(a, b))):
            cover[name] += math.log1p(ratio.low) <= truth <= math.log1p(ratio.high)
            half_cpu += (math.log1p(ratio.high) - math.log1p(ratio.low)) / 2 / reps if name == "cpu" else 0.0
    print(f"\nstalls: coverage of the mean log-ratio {cover['cpu'] / reps:.1%} by CPU time (nominal 95%), "
          f"{cover['wall'] / reps:.1%} by the wall-clock rule")
    assert cover["cpu"] / reps >= 0.92 and cover["wall"] / reps < 0.5
    # Covering by its width, not by being wide: the interval from the process means of the windows with no
    # stall at all, t(4) x sqrt(window variance / 200), window variance 2 x 2 %^2 + b's own slow windows
    # 0.05 x 0.95 x log(1.6)^2, is +-2.1 %.
    ideal = stats.t.ppf(0.975, 4) * math.sqrt((2 * 0.02**2 + 0.05 * 0.95 * math.log(1.6) ** 2) / (windows * processes))
    assert half_cpu <= 1.2 * ideal, (half_cpu, ideal)
    assert descheduled([1.0, 1.0, 3.0], None) == {2}  # no CPU times: the wall-clock rule
    assert descheduled([1.0, 1.0, 3.0], [1.0, 1.0, 3.0]) == set()  # it worked 3x as long: its own


def test_one_round_per_process_gives_an_interval_and_no_f_test() -> None:
    ratio = paired_windows({p: [0.010] for p in range(4)}, {p: [0.0103 * (1 + 0.01 * (-1) ** p)] for p in range(4)})
    assert ratio is not None and ratio.low is not None and ratio.process_p is None and ratio.df == 3
    assert ratio.basis == "process means"


def verdict_study(effects: dict[str, float], seed: int, rounds_n: int = 3) -> optuna.Study:
    rng = random.Random(seed)
    study = optuna.create_study()
    knobs = {"amp.dtype": "bfloat16", "optim.impl": "foreach", "compile.mode": "max-autotune-no-cudagraphs"}
    for r in range(rounds_n):
        machine = rng.gauss(0, 0.1)
        for label, effect in {"winner": 0.0, **effects}.items():
            step = 0.010 * math.exp(machine + effect + rng.gauss(0, 0.01))
            attrs = {"phase": "verdict", "round": r, "label": label, "identity": label, "constraints": {},
                     "result": {"status": "ok", "step_s": step, "compile_s": 10.0, "fingerprint": label},
                     "config": {"compile.scope": "module"}, "compile_s_cold": 10.0}
            if label != "winner":
                attrs |= {"knob": label, "value": knobs[label], "reference": "x"}
            study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs=attrs))
    return study


def test_a_verdict_neighbour_measurably_faster_to_train_is_found_after_holm() -> None:
    objective = Objective(ObjectiveSettings(horizon_steps=10000))
    found = {e.knob: e for e in verdicts(verdict_study({"amp.dtype": -0.3, "optim.impl": 0.0,
                                                        "compile.mode": 0.0}, seed=0), objective)}
    amp = found["amp.dtype"]
    assert amp.family == 3 and amp.family_measurable and amp.beats_winner and amp.score_high < 0
    assert "Holm over 3 verdicts" in amp.verdict and "measurably faster than the winner" in amp.verdict
    # Issue 50: a time-to-train interval says which compile spread it carries (the CPU class prior here).
    assert "(cold compile spread 10.0% on 8 df)" in amp.verdict and amp.as_dict()["score_spread"]
    assert not found["optim.impl"].beats_winner


def test_a_study_never_recommends_what_its_own_verdicts_beat() -> None:
    objective = Objective(ObjectiveSettings(horizon_steps=10000))
    study = verdict_study({"amp.dtype": -0.3, "optim.impl": 0.0}, seed=0)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
        "phase": "search", "config": {"compile.scope": "module"}, "identity": "w", "constraints": {},
        "result": {"status": "ok", "step_s": 0.010, "compile_s": 10.0}}))
    chosen, why = recommended(study, objective)
    assert chosen is not None and chosen.user_attrs["label"] == "amp.dtype"  # before: the search's best
    assert why.startswith("changed from trial 9") and "amp.dtype=bfloat16 trains measurably faster" in why
    calm = verdict_study({"amp.dtype": 0.0, "optim.impl": 0.0}, seed=0)
    calm.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
        "phase": "search", "config": {"compile.scope": "module"}, "identity": "w", "constraints": {},
        "result": {"status": "ok", "step_s": 0.010, "compile_s": 10.0}}))
    assert recommended(calm, objective) == (calm.trials[-1], "")


def test_an_invalid_one_knob_neighbour_is_asked_at_the_nearest_valid_configuration() -> None:
    space = SearchSpace(Env(), {})
    winner = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
        "config": {"compile.scope": "none", "optim.impl": "fused"}})
    left_out: list[str] = []
    found = {value: config.flat() for key, value, config in neighbours(winner, space, ["compile.scope"], left_out)}
    assert "train_step" in found and not left_out  # before: left out ("fused is not valid here")
    assert found["train_step"]["optim.impl"] == "default"  # the one knob it invalidates, to its default
    assert found["module"]["optim.impl"] == "fused"  # a valid neighbour keeps every other knob
