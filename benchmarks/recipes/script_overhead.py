"""What tuning a script costs per trial, against the script's own start-up (issue 29).

Runs ``task=measure`` on a script (eager: ``compile.scope=none`` and the script's own compile switched off,
so no compile time blurs the split) and the same script plainly with ``python``, for as many optimizer steps
as the trial ran, in alternating order, ``--repeats`` times each. Prints per run the trial's wall time split by
its own timeline (``trial.timeline.wall_split``: process start to the agent, the agent's imports, the script's
own start-up to its first forward, warm-up, timed windows, teardown to exit) and the plain run's wall time:

    python benchmarks/recipes/script_overhead.py                     # examples/scripts/train_gpt.py, 3 repeats
    python benchmarks/recipes/script_overhead.py --script examples/scripts/train_hf.py --args "--no-compile"

The per-trial overhead is the trial's wall time less the plain script's over the same steps; the whole
command's wall time adds the tuner's own start-up, once per study.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autocompile.trial.timeline import wall_split
from autocompile.trial.timing.result import TrialResult

ROOT = Path(__file__).resolve().parents[2]


def run_trial(script: str, args: str, root: Path) -> tuple[float, dict]:
    command = [sys.executable, "-m", "autocompile", f"script.path={script}", f'script.args="{args}"', "task=measure",
               "compile.scope=none", "tracking.enabled=false", f"output_root={root}"]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
    command_s = time.perf_counter() - started
    (result_file,) = sorted(root.glob("**/result.json"))
    return command_s, json.loads(result_file.read_text())


def run_plain(script: str, args: str, steps: int) -> float:
    command = [sys.executable, script, *shlex.split(args), f"--max_iters={steps}"]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", default="examples/scripts/train_gpt.py")
    parser.add_argument("--args", default="--no-compile --max_iters=400", help="the script's arguments in the trial")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    plain_args = " ".join(a for a in shlex.split(opts.args) if not a.startswith("--max_iters"))
    rows = []
    for repeat in range(opts.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            command_s, result = run_trial(opts.script, opts.args, Path(tmp))
        split = wall_split(TrialResult.from_json(result))
        steps = result["script"]["optimizer_steps"]
        plain_s = run_plain(opts.script, plain_args, steps)
        added = split["overhead_start_s"] + split["overhead_imports_s"] + split["teardown_s"]
        rows.append({"command_s": command_s, "trial_wall_s": result["wall_s"], "plain_s": plain_s, "steps": steps,
                     "added_s": added, **split})
        print(f"repeat {repeat}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in rows[-1].items()), flush=True)
    print(f"\n{opts.script} {opts.args!r}, {opts.repeats} repeats (median):")
    for key in rows[0]:
        print(f"  {key:<20} {statistics.median(r[key] for r in rows):8.2f}")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    extra = [r["trial_wall_s"] - r["plain_s"] for r in rows]
    print(f"\nper-trial overhead: the trial's wall less the plain script's over the same optimizer steps, per "
          f"repeat {', '.join(f'{x:+.2f}' for x in extra)} s (median {statistics.median(extra):+.2f} s); in the "
          f"trial's timeline, process start to the agent {med['overhead_start_s']:.2f} s, the agent's imports "
          f"{med['overhead_imports_s']:.2f} s (torch's among them, which the script then finds loaded), the "
          f"script's own start-up to its first forward {med['overhead_build_s']:.2f} s, teardown "
          f"{med['teardown_s']:.2f} s; the tuner's own start-up, once per study: "
          f"{med['command_s'] - med['trial_wall_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
