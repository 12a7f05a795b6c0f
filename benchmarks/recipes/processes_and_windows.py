"""Processes and windows per process of the side-by-side phases, chosen from the variance the records show
(issue 35): read the paired window log-ratios of studies' side-by-side processes, split their variance into a
window part (inside a process) and a process part (process means beyond what their windows explain), then
simulate the phase's interval (``intervals.paired_windows``, the rule the study uses) for P processes of W rounds
each, with what each costs on this machine (a process's start and builds, and its rounds).

    PYTHONPATH=. python benchmarks/recipes/processes_and_windows.py STUDY_DIR [STUDY_DIR ...]

STUDY_DIR: a study's run directory (``OUTPUT_ROOT/gpt2-tiny-bs8-seq128-ws1-cpu``), with ``phases/*-round*/``, or
an extract of its processes' windows and timings (``benchmarks/results/cpu-2core/issue35_phases/before``).
"""

import json
import math
import random
import statistics
import sys
from pathlib import Path

from autocompile.study.statistics.intervals import paired_windows
from autocompile.trial.timing.stats import clean_rounds


def processes(study: Path, phase: str) -> list[dict]:
    found = []
    for d in sorted(study.glob(f"phases/{phase}-round*")):
        result, progress = d / "result.json", d / "progress.jsonl"
        if not result.is_file() or not progress.is_file():
            continue
        r = json.loads(result.read_text())
        events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
        starts = [e["time"] for e in events if e["event"] == "candidate_start"]
        ready = [e["time"] for e in events if e["event"] == "candidate_ready"]
        rounds = [e["time"] for e in events if e["event"] == "round"]
        cands = {c["label"]: c for c in r.get("candidates", []) if c.get("step_s_windows")}
        if not starts or not ready or len(rounds) < 3 or len(cands) < 2:
            continue
        # Start and builds: wall minus the rounds; a round's seconds from the second on (the first warms up).
        per_round = (rounds[-1] - rounds[0]) / (len(rounds) - 1)
        found.append({"candidates": cands, "fixed_s": r["wall_s"] - per_round * len(rounds),
                      "round_s": per_round, "n": len(cands)})
    return found


def components(procs: list[dict], reference: str | None) -> tuple[float, float, int]:
    """Pooled window variance and process variance of the log-ratio of every candidate against ``reference``
    (None: the fastest candidate overall), over every pair; and how many pairs."""
    labels = set.intersection(*(set(p["candidates"]) for p in procs))
    if reference is None:
        reference = min(labels, key=lambda x: statistics.fmean(
            math.log(p["candidates"][x]["step_s"]) for p in procs))
    within, between, pairs = [], [], 0
    for label in sorted(labels - {reference}):
        groups = []
        for p in procs:
            ref, mine = p["candidates"][reference], p["candidates"][label]
            a, b = ref["step_s_windows"], mine["step_s_windows"]
            cpu = [ref.get("step_cpu_s_windows"), mine.get("step_cpu_s_windows")]
            keep = clean_rounds(a, b, cpu=cpu)
            groups.append([math.log(b[r] / a[r]) for r in keep])
        means = [statistics.fmean(g) for g in groups]
        ms_w = statistics.fmean(statistics.variance(g) for g in groups)
        inv_n = statistics.fmean(1 / len(g) for g in groups)
        within.append(ms_w)
        between.append(max(0.0, statistics.variance(means) - ms_w * inv_n))
        pairs += 1
    return statistics.fmean(within), statistics.fmean(between), pairs


def simulate(sd_w: float, sd_b: float, p: int, w: int, reps: int, seed: int) -> tuple[float, float]:
    """Mean 95 % half-width (log scale) and coverage of the study's paired-window interval at P x W."""
    rng = random.Random(seed)
    halves, covered = [], 0
    for _ in range(reps):
        a, b = {}, {}
        for k in range(p):
            shift = rng.gauss(0, sd_b)
            a[k] = [1.0] * w
            b[k] = [math.exp(shift + rng.gauss(0, sd_w)) for _ in range(w)]
        ratio = paired_windows(a, b)
        low, high = math.log1p(ratio.low), math.log1p(ratio.high)
        halves.append((high - low) / 2)
        covered += low <= 0 <= high
    return statistics.fmean(halves), covered / reps


def main(dirs: list[Path]) -> None:
    for phase, reference in (("confirm", None), ("verdict", "winner")):
        studies = [found for d in dirs if len(found := processes(d, phase)) >= 3]
        if not studies:
            continue
        procs = [p for found in studies for p in found]
        parts = [components(found, reference) for found in studies]  # a label is one program within one study
        pairs = sum(n for _, _, n in parts)
        var_w = sum(w * n for w, _, n in parts) / pairs
        var_b = sum(b * n for _, b, n in parts) / pairs
        sd_w, sd_b = math.sqrt(var_w), math.sqrt(var_b)
        fixed = statistics.median(p["fixed_s"] for p in procs)
        per_round = statistics.median(p["round_s"] for p in procs)
        n = statistics.median(p["n"] for p in procs)
        print(f"\n## {phase}: {len(procs)} processes of {len(studies)} stud(ies), {pairs} pair(s) against "
              f"{reference or 'the fastest'}, {n:g} candidates a process")
        print(f"window sd {sd_w:.2%}, process sd {sd_b:.2%} (log scale); a process: {fixed:.1f} s start and builds, "
              f"{per_round:.2f} s a round")
        print("| processes | rounds each | half-width, 95 % (mean) | coverage | phase wall s | vs 7 x 12 |")
        print("|---|---|---|---|---|---|")
        base = None
        for p, w in ((7, 12), (7, 8), (7, 6), (6, 12), (6, 8), (5, 12), (5, 16), (8, 8), (9, 6), (4, 24)):
            half, cover = simulate(sd_w, sd_b, p, w, 2000, seed=p * 100 + w)
            wall = p * (fixed + w * per_round)
            base = base or (half, wall)
            print(f"| {p} | {w} | {math.expm1(half):.2%} | {cover:.1%} | {wall:.0f} | "
                  f"half-width x{half / base[0]:.2f}, wall x{wall / base[1]:.2f} |")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
