"""Wall time of one study with 1 slot vs 2 slots on this machine, and how much the slots disturb
each other's measurements. Studies alternate (1, 2, 1, 2, ...) so drift hits both alike; medians.

    python benchmarks/recipes/bench_slots.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUDY = ["+model=gpt2-tiny", "workload.batch_size=4", "workload.seq_len=[64]", "workload.threads=1",
         "compile.backend=aot_eager", "study.prune=false", "tracking.enabled=false", "measure.windows=3",
         "measure.window_steps=4"]


def run_study(slots: int, n_trials: int, out: Path) -> tuple[float, dict[str, float]]:
    started = time.time()
    subprocess.run([sys.executable, "-m", "autocompile", *STUDY, f"study.n_trials={n_trials}",
                    f"launch.slots={slots}", f"output_root={out}"], cwd=ROOT, check=True, capture_output=True)
    wall = time.time() - started
    steps = {}
    for path in out.glob("*/trials/*/result.json"):
        result = json.loads(path.read_text())
        trial = json.loads((path.parent / "trial.json").read_text())
        if result["status"] == "ok":
            steps[json.dumps(trial["knobs"], sort_keys=True)] = result["step_s"]
    return wall, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="autocompile-slots-"))
    walls: dict[int, list[float]] = {1: [], 2: []}
    steps: dict[int, dict[str, list[float]]] = {1: {}, 2: {}}
    for r in range(args.repeats):
        for slots in (1, 2):
            wall, measured = run_study(slots, args.trials, root / f"s{slots}-r{r}")
            walls[slots].append(wall)
            for key, step in measured.items():
                steps[slots].setdefault(key, []).append(step)
            print(f"repeat {r}: {slots} slot(s): {wall:.1f} s for {args.trials} trials", flush=True)
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"\nmedian study wall time: 1 slot {one:.1f} s, 2 slots {two:.1f} s -> 2 slots take {two / one:.2f}x "
          f"the time ({one / two:.2f}x faster)")
    common = set(steps[1]) & set(steps[2])
    if common:
        ratios = [statistics.median(steps[2][k]) / statistics.median(steps[1][k]) for k in common]
        print(f"step time of the same configurations, 2 slots / 1 slot: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} configurations): the disturbance "
              "concurrent trials add to each other's measurements")
    print(f"studies in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
