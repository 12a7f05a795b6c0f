"""How far one configuration's step time moves across fresh processes, against how much its windows spread inside
one: the two parts of a search pair's uncertainty (``SearchNoise.pair_sd``). Runs ``task=measure`` N times alone,
one fresh process after the other, and prints each process's step time (the median of its windows), its window CV
and windows, then the sd of log step time across the processes against what the windows alone would give
(``sqrt(pi/2) * CV / sqrt(n)``, a median's sampling error) and against the window CV itself.

    PYTHONPATH=. python benchmarks/recipes/fresh_process_spread.py N OUT_DIR -- AUTOCOMPILE_ARGS...

Run it alone (``uptime`` first): another job on the 2-core VM moves the processes' levels apart.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path


def measure(out: Path, args: list[str]) -> dict:
    before = set(out.glob("*/measure/*/result.json"))
    subprocess.run([sys.executable, "-m", "autocompile", "task=measure", f"output_root={out}",
                    f"tracking.uri=sqlite:///{out}/mlflow.db", *args], check=True, capture_output=True)
    (found,) = set(out.glob("*/measure/*/result.json")) - before
    return json.loads(found.read_text())


def main() -> None:
    n, out, rest = int(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3:]
    args = rest[1:] if rest[:1] == ["--"] else rest
    out.mkdir(parents=True, exist_ok=True)
    print(f"`{' '.join(args)}`, {n} fresh processes one after the other\n")
    print("| process | step ms | window CV | windows |\n|---|---|---|---|")
    rows = []
    for k in range(n):
        r = measure(out, args)
        rows.append((r["step_s"], r["step_s_cv"], r["windows"]))
        print(f"| {k} | {r['step_s'] * 1e3:.4f} | {r['step_s_cv']:.1%} | {r['windows']} |", flush=True)
    between = statistics.stdev(math.log(s) for s, _, _ in rows)
    cv = statistics.fmean(c for _, c, _ in rows)
    windows = statistics.fmean(w for _, _, w in rows)
    print(f"\n- sd of log step time across the {n} processes: **{between:.1%}**")
    print(f"- what the windows alone would give (sqrt(pi/2) x CV / sqrt(n), mean CV {cv:.1%}, mean n {windows:.0f}): "
          f"{math.sqrt(math.pi / 2) * cv / math.sqrt(windows):.1%}")
    print(f"- the window CV itself (the floor `pair_sd` took per process before): {cv:.1%}")


if __name__ == "__main__":
    main()
