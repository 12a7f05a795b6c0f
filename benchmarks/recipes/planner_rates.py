"""How often "about N more processes would decide" decides: the closing note's table (issue 35's session).

For each true difference and noise, 1500 simulated studies of ``N0`` fresh-process rounds (the model of
tests/test_decision_rules.py); each undetermined one runs the processes the planner names and is classified again.

    PYTHONPATH=. python benchmarks/recipes/planner_rates.py 3   # and 5, 7
"""

import random
import statistics
import sys

from autocompile.study.statistics.decisions import classify, processes_to_decide
from autocompile.study.statistics.intervals import paired_ratio
from tests.test_decision_rules import MARGIN, rounds

N0 = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for true, noise in [(0.005, 0.02), (0.0, 0.02), (0.01, 0.02), (0.03, 0.03), (0.015, 0.01), (0.025, 0.02)]:
    rng = random.Random(0)
    decided, named = 0, []
    for _ in range(1500):
        first = rounds([true, 0.0], noise, N0, rng)
        if classify(paired_ratio(first[0], first[1]), MARGIN) != "undetermined":
            continue
        more = processes_to_decide(paired_ratio(first[0], first[1]), MARGIN, N0)
        if more is None:
            continue
        named.append(more)
        again = rounds([true, 0.0], noise, N0 + more, rng)
        decided += classify(paired_ratio(again[0], again[1]), MARGIN) != "undetermined"
    print(f"{N0} rounds, true {true:.1%}, noise {noise:.0%}: decided {decided / max(len(named), 1):.1%} of "
          f"{len(named)} undetermined studies, median {statistics.median(named) if named else '-'} more named")
