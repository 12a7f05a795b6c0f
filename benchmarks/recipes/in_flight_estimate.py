"""Where a study's process time went, by phase, and what the estimate's model of processes in flight makes of it on
machines of more cores (``autocompile.study.estimate.in_flight_wall``: the timed parts one at a time, the rest
``min(k, cores / CPU_PER_PROCESS)`` at a time).

Reads every process of a run directory (the reference, the search trials, the side-by-side processes): its wall, and
its timed part (from its turn on the device, ``lease_granted`` to ``lease_done``, or the worker's ``warmup_done`` to
``timed_done`` in a run made before the lease). Prints, per phase and in all, the processes' summed wall (one at a
time), their timed parts, and the model's wall with ``k`` in flight for each core count asked.

    PYTHONPATH=. python benchmarks/recipes/in_flight_estimate.py RUN_DIR --cores 2 8 16
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from autocompile.study.estimate import in_flight_wall
from autocompile.trial.slots import AUTO_MAX


def timed_part(directory: Path, result: dict) -> float:
    events = []
    path = directory / "progress.jsonl"
    if path.is_file():
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = next((e["time"] for e in events if e["event"] == "lease_granted"), None)
    end = next((e["time"] for e in events if e["event"] == "lease_done"), None)
    if start is not None and end is not None:
        return end - start
    t = result.get("timeline") or {}
    return t["timed_done"] - t["warmup_done"] if {"timed_done", "warmup_done"} <= t.keys() else 0.0


def phase_of(directory: Path, run: Path) -> str:
    rel = directory.relative_to(run).parts
    if rel[0] == "phases":
        return rel[1].split("-round")[0]
    return "trials (search, verdict cold runs)" if rel[0] == "trials" else rel[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--cores", type=int, nargs="+", default=[2, 8, 16])
    args = parser.parse_args()
    walls: dict[str, float] = defaultdict(float)
    timed: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for path in sorted(args.run.rglob("result.json")):
        if "inductor_cache" in path.parts:
            continue
        result = json.loads(path.read_text())
        if result.get("wall_s") is None:
            continue
        phase = phase_of(path.parent, args.run)
        walls[phase] += result["wall_s"]
        timed[phase] += timed_part(path.parent, result)
        count[phase] += 1
    walls["all"], timed["all"], count["all"] = sum(walls.values()), sum(timed.values()), sum(count.values())
    head = " | ".join(f"{c} cores, {min(c, AUTO_MAX)} in flight" for c in args.cores)
    print(f"| phase | processes | one at a time (s) | timed parts (s) | {head} |")
    print("|---" * (4 + len(args.cores)) + "|")
    for phase in [*sorted(p for p in walls if p != "all"), "all"]:
        model = " | ".join(f"{in_flight_wall(walls[phase], timed[phase], min(c, AUTO_MAX), c):.0f}" for c in args.cores)
        print(f"| {phase} | {count[phase]} | {walls[phase]:.0f} | {timed[phase]:.0f} | {model} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
