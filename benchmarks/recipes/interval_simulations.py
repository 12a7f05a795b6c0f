"""The numbers behind ``tests/test_interval_simulations.py`` (issue 50), as the table in ``docs/measuring.md``: the
same seeded simulations, each rule's coverage or error rate and its width, before and after where a rule changed.

    PYTHONPATH=. python benchmarks/recipes/interval_simulations.py \
        > benchmarks/results/cpu-2core/issue50/interval_simulations.md
"""

from __future__ import annotations

import math
import random
import statistics

from autocompile.config.sections import ObjectiveSettings
from autocompile.study.records.compile_prior import class_prior
from autocompile.study.statistics.decisions import p_value, two_looks
from autocompile.study.statistics.intervals import CompileSpread, paired_windows
from tests.test_interval_simulations import (
    MARGIN,
    WINDOW_SD,
    covers,
    half_width,
    race_once,
    side_by_side,
    ttt_coverage,
    windows_pooled_only,
)


def few_processes(reps: int = 2000) -> None:
    print("| process sd / window sd | processes | coverage (the rule) | median half-width | windows pooled only |")
    print("|---|---|---|---|---|")
    rng, truth = random.Random(50), math.log(0.95)
    for ratio in (3.0, 10.0):
        for processes in (2, 3, 5, 7):
            hits, pooled, widths = 0, 0, []
            for _ in range(reps):
                a, b = side_by_side(rng, [0.0, truth], [ratio * WINDOW_SD / 2] * 2, processes)
                r = paired_windows(a, b)
                hits += covers(r, truth)
                widths.append(half_width(r))
                mu, half = windows_pooled_only(a, b)
                pooled += mu - half <= truth <= mu + half
            print(f"| {ratio:g}x | {processes} | {hits / reps:.1%} | +-{statistics.median(widths):.1%} | "
                  f"{pooled / reps:.1%} |")


def heterogeneous(reps: int = 2000) -> None:
    print("\n| who is noisy (process sd 4 % against 1 %) | processes | coverage |\n|---|---|---|")
    truth = math.log(1.03)
    for name, sds in (("the leader", (0.04, 0.01)), ("the neighbour", (0.01, 0.04))):
        for processes in (3, 5, 7):
            rng = random.Random(processes)
            hits = sum(covers(paired_windows(*side_by_side(rng, [0.0, truth], sds, processes)), truth)
                       for _ in range(reps))
            print(f"| {name} | {processes} | {hits / reps:.1%} |")


def races(reps: int = 1500) -> None:
    print("\n| race | processes | error |\n|---|---|---|")
    true_logs = [math.log(1.025), math.log(0.97), math.log(1.03), 0.0, math.log(1.01)]
    for processes in (3, 7):
        rng = random.Random(7 + processes)
        worse = sum(true_logs[race_once(rng, true_logs, processes, [0.005, 0.01, 0.03, 0.005, 0.005])[0]]
                    - min(true_logs) > math.log1p(MARGIN) for _ in range(reps))
        print(f"| five candidates, the best 3 % ahead: recommends one more than 2 % behind it | {processes} | "
              f"{worse / reps:.2%} |")
    rng = random.Random(11)
    claims = [race_once(rng, [0.0] * 4, 5, [0.01] * 4)[1] for _ in range(reps)]
    false = sum(s in ("slower", "faster") for status in claims for s in status) / (3 * reps)
    print(f"| four equal candidates: one called measurably apart from the leader chosen among them | 5 | {false:.2%} |")


def holm_twelve(reps: int = 1500) -> None:
    rng = random.Random(12)
    errors = 0
    for _ in range(reps):
        per = side_by_side(rng, [0.0] * 13, [0.015] + [0.005] * 12, 7)
        first = [p_value(paired_windows({p: per[0][p] for p in range(4)}, {p: c[p] for p in range(4)}))
                 for c in per[1:]]
        stopped, later = two_looks(first, [p_value(paired_windows(per[0], c)) for c in per[1:]])
        errors += any(stopped) or any(later)
    print(f"\nHolm at two looks over 12 side-by-side neighbours of no effect, a winner 3x noisier (7 processes): "
          f"{errors / reps:.2%} family-wise (nominal 5 %).")


def compile_spread() -> None:
    print("\n| true compile spread | compile share of time to train | before: measured on 1 df alone | after: pooled "
          "with the CPU prior (10 %, 8 df) |\n|---|---|---|---|")
    prior = class_prior("cpu", ObjectiveSettings())
    for cv, compile_s in ((0.03, 20.0), (0.10, 20.0), (0.10, 100.0), (0.20, 20.0)):
        cells = []
        for rule in (None, prior):
            c, median, p90 = ttt_coverage(cv, rule, compile_s=compile_s)
            cells.append(f"{c:.1%}, +-{median:.1%} (90th pct +-{p90:.1%})")
        share = compile_s / (compile_s + 100.0)
        print(f"| {cv:.0%} | {share:.0%} | {cells[0]} | {cells[1]} |")
    c, median, _ = ttt_coverage(0.20, CompileSpread(0.20, 12, "learned"), seed=1)
    print(f"\nA machine spreading 20 % whose earlier studies measured 12 df (the prior learned, the class's set "
          f"aside): {c:.1%}, +-{median:.1%}.")


def main() -> None:
    print("# Side-by-side intervals and the race at few processes, simulated (issue 50)\n")
    print("`PYTHONPATH=. python benchmarks/recipes/interval_simulations.py`; the same generators as "
          "`tests/test_interval_simulations.py`. Window noise 1 %, 12 rounds a process unless said.\n")
    few_processes()
    heterogeneous()
    races()
    holm_twelve()
    compile_spread()


if __name__ == "__main__":
    main()
