"""The device lease's A/A: one candidate measured alone, and measured while another candidate compiles beside it.

Each repeat runs ``task=measure`` of candidate A alone (and B alone), then A and B at once (two tuners: the lease is the
machine's, so B's compile is paused while A times, and A's while B times). The order alternates between repeats so
drift hits both arms alike. Printed: A's step time beside / alone (paired by repeat, a t interval over repeats),
A's compile time beside / alone with the spread of the alone compiles, what a study would price each shared compile
at (its CPU seconds at the lone compiles' rate, ``study.records.lone_compile``) against its lone wall, and what the
lease recorded (seconds paused, seconds compiling while another process ran).

    python benchmarks/recipes/lease_aa.py --repeats 5 --out benchmarks/results/cpu-2core/issue51/lease_aa.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
A = ["compile.scope=module"]
B = ["compile.scope=train_step"]
COMMON = ["+model=gpt2-tiny", "task=measure", "tracking.enabled=false"]


def start(args: list[str], out: Path, lease_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AUTOCOMPILE_LEASE_DIR": str(lease_dir)}
    return subprocess.Popen([sys.executable, "-m", "autocompile", *COMMON, *args, f"output_root={out}"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def result(out: Path) -> dict[str, Any]:
    (path,) = out.glob("*/measure/*/result.json")
    return json.loads(path.read_text())


def finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a measurement failed: {err.decode()[-2000:]}")


def row(r: dict[str, Any]) -> dict[str, Any]:
    lease = r.get("lease") or {}
    # task=measure prices nothing as alone: its wall compile time is the one to compare
    return {"step_s": r["step_s"], "compile_s": lease.get("compile_wall_s", r["compile_s"]),
            "compile_cpu_s": r.get("compile_cpu_s"), "wall_s": r["wall_s"], "lease": lease}


def repeat(i: int, root: Path, lease_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"repeat": i}
    arms = ("alone", "beside") if i % 2 == 0 else ("beside", "alone")
    for arm in arms:
        base = root / f"r{i}-{arm}"
        t0 = time.time()
        if arm == "alone":  # A alone, then B alone: each compile's lone wall and rate
            a = start(A, base / "a", lease_dir)
            finish(a)
            wall = time.time() - t0
            b = start(B, base / "b", lease_dir)
            finish(b)
            out["alone"] = {"a": row(result(base / "a")), "b": row(result(base / "b")), "wall_s": wall}
        else:
            a, b = start(A, base / "a", lease_dir), start(B, base / "b", lease_dir)
            finish(a)
            finish(b)
            out["beside"] = {"a": row(result(base / "a")), "b": row(result(base / "b")), "wall_s": time.time() - t0}
    return out


def interval(logs: list[float]) -> tuple[float, float, float]:
    """Mean ratio and its 95% t interval from per-repeat log-ratios."""
    m = statistics.fmean(logs)
    h = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    return math.exp(m), math.exp(m - h), math.exp(m + h)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' directories here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="autocompile-lease-aa-") as tmp:
        root = args.keep or Path(tmp)
        lease_dir = root / "lease"
        for i in range(args.repeats):
            rows.append(repeat(i, root, lease_dir))
            r = rows[-1]
            print(f"repeat {i}: A alone {r['alone']['a']['step_s'] * 1e3:.2f} ms/step, compile "
                  f"{r['alone']['a']['compile_s']:.1f} s | A beside B {r['beside']['a']['step_s'] * 1e3:.2f} ms/step,"
                  f" compile {r['beside']['a']['compile_s']:.1f} s (lease {r['beside']['a']['lease']}) | B compile "
                  f"{r['beside']['b']['compile_s']:.1f} s (lease {r['beside']['b']['lease']})", flush=True)
    step = interval([math.log(r["beside"]["a"]["step_s"] / r["alone"]["a"]["step_s"]) for r in rows])
    comp = interval([math.log(r["beside"]["a"]["compile_s"] / r["alone"]["a"]["compile_s"]) for r in rows])
    alone_c = [r["alone"]["a"]["compile_s"] for r in rows]
    spread = statistics.stdev(alone_c) / statistics.fmean(alone_c) if len(alone_c) > 1 else math.nan
    # What the study prices a shared compile at (study.records.lone_compile): its CPU seconds at the rate of the lone
    # compiles, here A's and B's own alone runs pooled as a study's would be.
    rate = statistics.median(r["alone"][k]["compile_cpu_s"] / r["alone"][k]["compile_s"] for r in rows
                             for k in ("a", "b"))
    priced = interval([math.log(r["beside"]["a"]["compile_cpu_s"] / rate / r["alone"]["a"]["compile_s"])
                       for r in rows])
    priced_b = interval([math.log(r["beside"]["b"]["compile_cpu_s"] / rate / r["alone"]["b"]["compile_s"])
                         for r in rows])
    summary = {
        "a": A, "b": B, "common": COMMON, "repeats": args.repeats,
        "step_beside_over_alone": {"ratio": step[0], "low": step[1], "high": step[2]},
        "compile_beside_over_alone": {"ratio": comp[0], "low": comp[1], "high": comp[2]},
        "alone_compile_cv": spread,
        "lone_rate": rate,
        "a_priced_as_alone_over_alone": {"ratio": priced[0], "low": priced[1], "high": priced[2]},
        "b_priced_as_alone_over_alone": {"ratio": priced_b[0], "low": priced_b[1], "high": priced_b[2]},
        "wall_beside_s": statistics.median(r["beside"]["wall_s"] for r in rows),
        "wall_alone_a_s": statistics.median(r["alone"]["wall_s"] for r in rows),
    }
    print(f"\nA's step time beside B / alone: {step[0]:.3f} [{step[1]:.3f}, {step[2]:.3f}] (95% t, {args.repeats} "
          f"repeats)\nA's compile beside B / alone: {comp[0]:.3f} [{comp[1]:.3f}, {comp[2]:.3f}]; the alone "
          f"compiles' spread (cv) {spread:.1%}\npriced as alone (CPU s at the lone rate {rate:.2f}) / alone: A "
          f"{priced[0]:.3f} [{priced[1]:.3f}, {priced[2]:.3f}], B {priced_b[0]:.3f} [{priced_b[1]:.3f}, "
          f"{priced_b[2]:.3f}]")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
