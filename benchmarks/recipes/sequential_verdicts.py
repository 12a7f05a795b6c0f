"""The verdict phase read once (at the end, Holm at 5 %) against two looks (after 4 of 7 processes at 1 %, the
end at 4 %): family-wise error, each neighbour found, and the neighbour-processes the first look saves.
Side-by-side windows simulated as tests/test_sequential_verdicts.py models them (issue 35's closing note).

    PYTHONPATH=. python benchmarks/recipes/sequential_verdicts.py
"""

import math

from tests.test_sequential_verdicts import PROCESS_SD, PROCESSES, ROUNDS, WINDOW_SD, simulate

CASES = {
    "6 of no effect": [0.0] * 6,
    "a compiled winner's 12 (4 at 20-60 %, 4 at 2-5 %, 4 none)":
        [math.log(x) for x in (1.6, 1.3, 1.2, 0.8, 1.05, 1.03, 0.98, 1.02)] + [0.0] * 4,
    "20 %, 20 %, 3 %, none": [math.log(1.2), math.log(1.2), math.log(1.03), 0.0],
    "6 at 2 %": [math.log(1.02)] * 6,
}
print(f"# {PROCESSES} processes x {ROUNDS} rounds, window sd {WINDOW_SD:.0%}, process sd {PROCESS_SD:.0%} (log scale)")
print("| neighbours (true step change) | studies | >= 1 false 'measurably': one look | two looks | found, one look "
      "| found, two looks | neighbour-processes saved |")
print("|---|---|---|---|---|---|---|")
for name, true in CASES.items():
    reps = 1000
    r = simulate(true, reps, seed=0)
    real = [i for i, t in enumerate(true) if t != 0]
    one = sum(r[f"found_one_{i}"] for i in real) / len(real) if real else math.nan
    two = sum(r[f"found_two_{i}"] for i in real) / len(real) if real else math.nan
    print(f"| {name} | {reps} | {r['false_one']:.1%} | {r['false_two']:.1%} | {one:.1%} | {two:.1%} | "
          f"{r['saved']:.1%} |")
