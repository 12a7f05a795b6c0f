"""The time-to-train interval's compile spread, by simulation: measured alone (a study's few cold compiles) against
measured pooled with the prior (``objective.compile_cv`` and its ``compile_df`` as prior degrees of freedom).

Two leaders a default gpt2-tiny study confirms: 10 ms steps within 1 %, 20 s cold compiles each, 10000 steps;
5 side-by-side processes of 30 windows (2 % window noise, 0.5 % process noise). The study compiled ``programs``
programs cold ``times`` times each; the true spread of one cold compile is ``cv``. For each rule: coverage of the
95 % interval of the time-to-train ratio (nominal 95 %) and its mean half-width. "pooled unless wider": pooled,
unless the measured spread is wider than the prior by an F test at 90 % (then measured alone).

    PYTHONPATH=. python benchmarks/recipes/compile_spread_rules.py
"""

from __future__ import annotations

import math
import random
import statistics

from scipy.stats import f as f_dist

from autocompile.study.statistics.intervals import level, paired_windows, time_to_train
from autocompile.study.statistics.noise import pooled_noise

PRIOR_CV, PRIOR_DF = 0.06, 4
HORIZON, STEP, COMPILE, RATIO = 10000, 0.010, 20.0, 0.99


def pooled_compile_spread(measured_cv: float, measured_df: float, prior_cv: float, prior_df: float
                          ) -> tuple[float, float]:
    """The measured spread pooled with the prior, the prior counted as ``prior_df`` degrees of freedom."""
    df = measured_df + prior_df
    return math.sqrt((measured_df * measured_cv**2 + prior_df * prior_cv**2) / df), df


def windows(rng: random.Random, processes: int = 5, n: int = 30) -> tuple[dict[int, list[float]], ...]:
    a, b = {}, {}
    for p in range(processes):
        shared, own = rng.gauss(0, 0.1), rng.gauss(0, 0.005)
        a[p] = [STEP * math.exp(shared + rng.gauss(0, 0.02)) for _ in range(n)]
        b[p] = [STEP * RATIO * math.exp(shared + own + rng.gauss(0, 0.02)) for _ in range(n)]
    return a, b


def geomean(per: dict[int, list[float]]) -> float:
    return math.exp(statistics.fmean(math.log(x) for w in per.values() for x in w))


def run(cv: float, programs: int, times: int, reps: int = 2000, seed: int = 0) -> dict[str, tuple[float, float]]:
    rng = random.Random(seed)
    truth = math.log((COMPILE + HORIZON * STEP * RATIO) / (COMPILE + HORIZON * STEP))
    found: dict[str, list[tuple[bool, float]]] = {"measured": [], "pooled with the prior": [], "pooled unless": []}
    for _ in range(reps):
        a, b = windows(rng)
        step = paired_windows(a, b)
        measured = pooled_noise([[math.exp(rng.gauss(0, cv)) for _ in range(times)] for _ in range(programs)], "")
        sides = ((geomean(a), COMPILE * math.exp(rng.gauss(0, cv))), (geomean(b), COMPILE * math.exp(rng.gauss(0, cv))))
        pooled = pooled_compile_spread(measured.rel_sd, measured.df, PRIOR_CV, PRIOR_DF)
        wider = measured.rel_sd**2 / PRIOR_CV**2 > f_dist.ppf(0.9, measured.df, PRIOR_DF)
        unless = (measured.rel_sd, measured.df) if wider else pooled
        for name, (sd, df) in (("measured", (measured.rel_sd, measured.df)), ("pooled with the prior", pooled),
                               ("pooled unless", unless)):
            ttt = time_to_train(step, *sides, HORIZON, sd, df, step_level=level(a))
            found[name].append((math.log1p(ttt.low) <= truth <= math.log1p(ttt.high), (ttt.high - ttt.low) / 2))
    return {k: (statistics.fmean(c for c, _ in v), statistics.fmean(w for _, w in v)) for k, v in found.items()}


def main() -> None:
    print("| true cv | cold compiles | measured | pooled with the prior | pooled unless wider (F 90 %) |")
    print("|---|---|---|---|---|")
    for cv in (0.03, 0.06, 0.10, 0.15):
        for programs, times in ((1, 2), (2, 2), (3, 3)):
            r = run(cv, programs, times)
            print(f"| {cv:.0%} | {programs} x {times} ({programs * (times - 1)} df) | "
                  + " | ".join(f"{c:.1%}, +-{w:.1%}" for c, w in r.values()) + " |")


if __name__ == "__main__":
    main()
