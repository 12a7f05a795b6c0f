"""Where a study run in flight leaves a core idle (issue 51): from its processes' ``result.json`` (wall time, ending at
the file's modification time) and ``progress.jsonl`` (the lease's turns), the seconds with the lease held, and outside
the turns the seconds with 0, 1 or 2+ processes running, then each stretch of 2 s or more when one ran alone.

    python benchmarks/recipes/idle_cores.py RUN_DIR

``RUN_DIR``: the study's run directory (``<output_root>/<study name>``), e.g. one of ``reuse_study.sh``'s first
studies.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STEP_S = 0.1


def turns(run_dir: Path) -> list[tuple[float, float]]:
    """(granted, done) of every turn on the device, from the progress events."""
    found = []
    for path in run_dir.glob("**/progress.jsonl"):
        granted = None
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event["event"] == "lease_granted":
                granted = event["time"]
            elif event["event"] == "lease_done" and granted is not None:
                found.append((granted, event["time"]))
                granted = None
    return found


def main(run_dir: Path) -> None:
    processes = []
    for path in run_dir.glob("**/result.json"):
        end, wall = os.path.getmtime(path), json.loads(path.read_text()).get("wall_s") or 0.0
        processes.append((end - wall, end, str(path.parent.relative_to(run_dir))))
    start, stop = min(p[0] for p in processes), max(p[1] for p in processes)
    held = turns(run_dir)
    counts = {"lease held": 0.0, "0 running": 0.0, "1 running": 0.0, "2+ running": 0.0}
    alone: list[tuple[float, float, str]] = []
    t = start
    while t < stop:
        running = [name for s, e, name in processes if s <= t < e]
        if any(s <= t < e for s, e in held):
            counts["lease held"] += STEP_S
        else:
            part = "0 running" if not running else "1 running" if len(running) == 1 else "2+ running"
            counts[part] += STEP_S
            if len(running) == 1:
                if alone and alone[-1][2] == running[0] and abs(alone[-1][0] + alone[-1][1] - t) < 1.5 * STEP_S:
                    alone[-1] = (alone[-1][0], alone[-1][1] + STEP_S, running[0])
                else:
                    alone.append((t, STEP_S, running[0]))
        t += STEP_S
    print(f"{run_dir}: {len(processes)} processes over {stop - start:.0f} s, {len(held)} turns")
    for part, seconds in counts.items():
        print(f"  {part}: {seconds:.0f} s")
    print("  alone for 2 s or more (from the first process's start):")
    for at, seconds, name in alone:
        if seconds >= 2:
            print(f"    {at - start:6.1f} s  {seconds:5.1f} s  {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
