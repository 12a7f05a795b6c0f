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

# The time-to-train family (issue 35, the stop for a time to train beyond the processes): a neighbour decided in
# step time whose time to train only more cold compiles could decide leaves at the first look too.
from tests.test_sequential_verdicts import COMPILE_CV, HORIZON, STEP_S, simulate_scores  # noqa: E402

SCORE_CASES = {
    "4 equal to train (steps +20 %, compile 40 s vs the winner's 60 s), 2 +20 % to train":
        ([math.log(1.2)] * 6, [60.0] + [40.0] * 4 + [92.0] * 2),
    "6 equal to train (steps +5 %, compile 55 s vs 60 s)": ([math.log(1.05)] * 6, [60.0] + [55.0] * 6),
    "6 at +10 % steps, the same compile (+6 % to train)": ([math.log(1.1)] * 6, [60.0] * 7),
    "6 at +30 % steps, the same compile (+19 % to train)": ([math.log(1.3)] * 6, [60.0] * 7),
    "6 of no effect (same steps, same compile)": ([0.0] * 6, [60.0] * 7),
}
print(f"\n# time to train {HORIZON} steps of {STEP_S * 1e3:.0f} ms, cold compiles spread {COMPILE_CV:.0%} (4 df)")
print("| neighbours | studies | >= 1 false 'measurably' to train: first look decided only | with the stop beyond the "
      "processes | time to train found (truly different), without | with | neighbour-processes saved, without | with |")
print("|---|---|---|---|---|---|---|---|")
for name, (true, compiles) in SCORE_CASES.items():
    reps = 1000
    off = simulate_scores(true, compiles, reps, seed=0, stop_beyond=False)
    on = simulate_scores(true, compiles, reps, seed=0)
    ttt = [c + HORIZON * STEP_S * math.exp(s) for c, s in zip(compiles, [0.0, *true], strict=True)]
    real = [i for i, t in enumerate(ttt[1:]) if abs(t / ttt[0] - 1) >= 1e-3]
    found = [sum(r[f"found_{i}"] for i in real) / len(real) if real else math.nan for r in (off, on)]
    print(f"| {name} | {reps} | {off['false']:.1%} | {on['false']:.1%} | {found[0]:.1%} | {found[1]:.1%} | "
          f"{off['saved']:.1%} | {on['saved']:.1%} |")
