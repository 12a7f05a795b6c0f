"""Validate the GPU path in one call: the CUDA tests, GPT-2 124M under the main configurations, a short study.

On the GPU box (torch there, the tuner's other packages carried as wheels in .whl/, see
scripts/prepare_wheels.sh), through the wrapper that installs them first:

    bash scripts/gpu_check.sh                          # everything, under 9 minutes
    bash scripts/gpu_check.sh --skip-tests --skip-study --only max-autotune-no-cudagraphs,max-autotune --name rest

Anywhere (the flow on a CPU, CUDA-only configurations skipped):

    python scripts/gpu_check.py --device cpu --model gpt2-tiny --batch-size 2 --seq-len 64 --only eager,default

Everything lands in one folder, ``$OUT`` if set, else ``benchmarks/results/<device>/``, to commit as
it is: ``NAME.md`` (the table, environment, command), ``NAME.json`` (every number), ``pytest.log``,
``study.log`` and ``NAME_trials.log`` (the stderr tail of each trial that did not finish); ``--name``
(default ``gpu_check``) keeps a second call from overwriting the first.

Time budget (``--budget-s``, default 510 s, so that with the wrapper's install the call stays under
9 minutes; the device machine allows 10 per command). Stages run one after another, never side by
side, since concurrent compiles would distort the compile times being measured:
  1. CUDA tests (tiny models): at most ``--tests-s`` (150 s); each test compiles in seconds, the
     max-autotune ones take longer; four pytest workers share the GPU.
  2. Benchmark: each configuration is a trial in a fresh torchrun process tree with a cold inductor
     cache, time-boxed by ``measure.timeout_s`` = min(its cap, time left), so a hang costs its cap and
     no more. A cold compile of GPT-2 124M takes ~40-60 s on a 16-core box plus ~10 s of process start
     and imports; ``train_step`` also compiles the optimizer. Configurations run in order of how much
     they tell; one that no longer fits (< 30 s left) is listed as not run, with the command that
     measures the rest in a second call.
     max-autotune benchmarks Triton kernel choices for every matmul shape, minutes of work cold:
     ``max-autotune-no-cudagraphs`` runs cold with a 150 s cap, then ``max-autotune`` reuses its cache
     (same shapes, same choices), so it measures what CUDA graphs add; its compile time is marked warm.
  3. A short study (``--study-trials`` 4: the three baselines and one sampled trial) of gpt2-tiny with
     MLflow tracking off (MLflow is not carried), at most ``--study-s`` (90 s), reserved from the start.
Each stage also keeps 15 s (``KILL_GRACE_S``) for stopping it, so an overrun cannot pass the budget.
Rough sum (estimates, not yet measured on the box): tests 60-90 s, study 70 s, eager 20 s, the cold
compiles 50-70 s each: the first call measures the first five or six configurations, a second one
(``--skip-tests --skip-study --only ... --name rest``, printed at the end) the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere: the scripts import the package of this tree

BF16 = {"amp.dtype": "bfloat16"}
MIN_TRIAL_S = 30.0
"""A configuration is not started with less time left than this: it could not even finish its imports."""
KILL_GRACE_S = 15.0
"""Ending a stage past its time takes this long at most (SIGINT, a wait, SIGKILL); kept out of its time."""


@dataclass(frozen=True)
class BenchConfig:
    name: str
    knobs: dict[str, Any]
    cap_s: float
    """Most seconds this trial may take (its measure.timeout_s), start and compile included."""
    cuda_only: bool = False
    warm_from: str = ""
    """Reuse the inductor cache of that earlier configuration (its compile time is then not cold)."""
    note: str = ""


CONFIGS = (
    BenchConfig("eager", {"compile.scope": "none", **BF16}, 90),
    BenchConfig("default", {"compile.scope": "module", **BF16}, 150, note="torch.compile(model)"),
    BenchConfig("reduce-overhead", {"compile.scope": "module", "compile.mode": "reduce-overhead", **BF16}, 150,
                cuda_only=True),
    BenchConfig("regional", {"compile.scope": "regional", **BF16}, 150, note="each GPT2Block"),
    BenchConfig("train_step", {"compile.scope": "train_step", **BF16}, 180, note="forward, loss, backward, optimizer"),
    BenchConfig("fp16+scaler", {"compile.scope": "module", "amp.dtype": "float16"}, 150, cuda_only=True,
                note="float16 autocast with a GradScaler"),
    BenchConfig("ac+cudagraphs", {"compile.scope": "module", "compile.mode": "reduce-overhead", "ac.policy": "block",
                                  **BF16}, 150, cuda_only=True, note="per-block checkpointing under CUDA graphs"),
    BenchConfig("max-autotune-no-cudagraphs",
                {"compile.scope": "module", "compile.mode": "max-autotune-no-cudagraphs", **BF16}, 150),
    BenchConfig("max-autotune", {"compile.scope": "module", "compile.mode": "max-autotune", **BF16}, 120,
                cuda_only=True, warm_from="max-autotune-no-cudagraphs",
                note="autotuning cache reused from max-autotune-no-cudagraphs"),
)


@dataclass
class Clock:
    """One deadline for the whole call; each stage asks how much of it is left."""

    budget_s: float
    start: float = field(default_factory=time.time)

    def left(self, reserve_s: float = 0.0) -> float:
        return self.start + self.budget_s - reserve_s - time.time()


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_bounded(cmd: list[str], timeout_s: float, log_path: Path) -> tuple[int, str]:
    """Run ``cmd`` with its output in ``log_path``; past ``timeout_s`` it gets SIGINT (the tuner then stops
    its trials), then SIGKILL for what is left of its process tree. Returns the exit code (124 on timeout) and
    the output."""
    with open(log_path, "w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            from autocompile.trial.launcher import kill_tree

            code = 124
            kill_tree(proc, grace_s=KILL_GRACE_S - 5, first=signal.SIGINT)
            out.write(f"\n[gpu_check] stopped after {timeout_s:.0f} s (time budget)\n")
    return code, log_path.read_text(errors="replace")


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "hostname": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": os.environ.get("GPU_CHECK_COMMAND") or shlex.join([sys.executable, *sys.argv]),
    }
    for package in ("triton", "transformers", "optuna", "hydra", "omegaconf"):
        spec = importlib.util.find_spec(package)
        if spec is not None:
            with contextlib.suppress(Exception):
                env[package] = __import__(package).__version__
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env |= {"device_name": props.name, "capability": f"{props.major}.{props.minor}",
                "gpu_memory_gib": round(props.total_memory / 2**30, 1), "gpus": torch.cuda.device_count()}
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
    else:
        env["device_name"] = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        env["git_commit"] = commit.stdout.strip() or None
    return env


def device_slug(env: dict[str, Any], device: str) -> str:
    name = env["device_name"] if device == "cuda" else f"cpu-{env['cpus']}core"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_tests(clock: Clock, cap_s: float, out_dir: Path) -> dict[str, Any]:
    """``pytest -m cuda``: pass/fail of every GPU-only path (see tests/test_cuda.py)."""
    timeout = min(cap_s, clock.left(KILL_GRACE_S))
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-m", "cuda", "-q", "-rs",
           "--timeout", str(int(timeout)), "tests/test_cuda.py"]
    if importlib.util.find_spec("xdist"):
        cmd += ["-n", "4", "--dist", "load"]  # four processes share the GPU; the compiles use the 16 cores
    if importlib.util.find_spec("pytest_benchmark"):
        cmd += ["-p", "no:benchmark"]
    log(f"CUDA tests (at most {timeout:.0f} s)")
    started = time.time()
    code, output = run_bounded(cmd, timeout, out_dir / "pytest.log")
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)),
                   lines[-1] if lines else "")
    log(f"CUDA tests: exit {code}: {summary}")
    return {"exit_code": code, "summary": summary, "seconds": round(time.time() - started, 1),
            "command": shlex.join(cmd)}


def bench(args: argparse.Namespace, clock: Clock, out_dir: Path, work: Path, reserve_s: float) -> list[dict[str, Any]]:
    import yaml

    from autocompile.app import CONF_DIR
    from autocompile.config.knobs import Env, TrialConfig
    from autocompile.config.settings import model_spec
    from autocompile.config.spec import MeasureSettings, TrialSpec, Workload
    from autocompile.trial.launcher import launch

    model = model_spec(yaml.safe_load((CONF_DIR / "model" / f"{args.model}.yaml").read_text()), [])
    workload = Workload(batch_size=args.batch_size, seq_len=[args.seq_len], device=args.device)
    env = Env.detect(args.device, 1, False)
    chosen = [c for c in CONFIGS if not args.only or c.name in args.only]
    rows: list[dict[str, Any]] = []
    for c in chosen:
        row: dict[str, Any] = {"name": c.name, "knobs": c.knobs, "note": c.note, "cache": "-"}
        rows.append(row)
        left = clock.left(reserve_s + KILL_GRACE_S)
        if c.cuda_only and args.device != "cuda":
            row |= {"status": "skipped", "reason": "needs CUDA"}
            continue
        if left < MIN_TRIAL_S:
            row |= {"status": "not run", "reason": f"time budget ({left:.0f} s left)"}
            continue
        config = TrialConfig.from_flat(c.knobs, env)
        timeout = min(c.cap_s, left)
        spec = TrialSpec(knobs=config.flat(), model=model, workload=workload, device=args.device,
                         threads=workload.resolved_threads(),
                         measure=MeasureSettings(windows=args.windows, window_steps=args.window_steps,
                                                 timeout_s=timeout))
        cache = work / "trials" / c.warm_from / "inductor_cache" if c.warm_from else None
        if cache is not None and cache.is_dir():
            row["cache"] = f"warm ({c.warm_from})"
        else:
            cache, row["cache"] = None, "cold"
        log(f"{c.name}: {', '.join(f'{k}={v}' for k, v in c.knobs.items())} (at most {timeout:.0f} s)")
        result = launch(work / "trials" / c.name, spec, cache_dir=cache)
        row |= {"status": result["status"], "timeout_s": round(timeout), "result": result}
        if result["status"] != "ok":
            row["reason"] = f"{result.get('failure', result['status'])}: {result.get('reason', '')}"
            tail = (work / "trials" / c.name / "stderr.log")
            with open(out_dir / f"{args.name}_trials.log", "a") as f:
                f.write(f"===== {c.name}: {row['reason']}\n")
                if tail.exists():
                    f.write("\n".join(tail.read_text(errors="replace").splitlines()[-60:]) + "\n")
        log(f"{c.name}: {describe_row(row)}")
    return rows


def describe_row(row: dict[str, Any]) -> str:
    r = row.get("result") or {}
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason', '')}"[:300]
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (f"{r['tokens_per_s']:,.0f} tokens/s{mfu}, compile {r['compile_s']:.1f} s, "
            f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB, wall {r['wall_s']:.0f} s")


def run_study(args: argparse.Namespace, clock: Clock, out_dir: Path, work: Path) -> dict[str, Any]:
    """A short study end to end: Hydra, Optuna, the trial loop, the report (MLflow off: not carried)."""
    timeout = min(args.study_s, clock.left(KILL_GRACE_S))
    if timeout < MIN_TRIAL_S * 2:
        return {"status": "not run", "reason": f"time budget ({timeout:.0f} s left)"}
    root = work / "study"
    cmd = [sys.executable, "-m", "autocompile", f"+model={args.study_model}", f"workload.device={args.device}",
           "workload.batch_size=8", "workload.seq_len=[128]", f"study.n_trials={args.study_trials}",
           # Stop starting trials early enough for the last one to finish inside the cap.
           f"study.timeout_s={max(1, int(timeout - 35))}", "measure.windows=3", "measure.window_steps=3",
           "measure.timeout_s=60", "tracking.enabled=false", f"output_root={root}"]
    log(f"study: {args.study_trials} trials of {args.study_model} (at most {timeout:.0f} s)")
    started = time.time()
    code, _ = run_bounded(cmd, timeout, out_dir / "study.log")
    study: dict[str, Any] = {"exit_code": code, "seconds": round(time.time() - started, 1), "command": shlex.join(cmd)}
    summaries = sorted(root.glob("*/summary.json"))
    if summaries:
        s = json.loads(summaries[-1].read_text())
        best = s.get("best") or {}
        study |= {"study": s["study"], "counts": s["counts"], "stop_reason": s["stop_reason"],
                  "best": best.get("name"), "best_compiled": (best.get("result") or {}).get("compiled"),
                  "speedups": s.get("speedups")}
    study["status"] = "ok" if code == 0 and summaries else "failed"
    log(f"study: {study['status']} (exit {code}): {study.get('counts')}, best {study.get('best')!r}")
    return study


def table(rows: list[dict[str, Any]]) -> str:
    head = ("configuration", "status", "tokens/s", "MFU", "compile s", "peak mem GiB", "step ms (CV)", "wall s",
            "cache")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        r = row.get("result") or {}
        if row["status"] == "ok":
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
            cells = [f"{r['tokens_per_s']:,.0f}", mfu, f"{r['compile_s']:.1f}",
                     f"{r['peak_memory_bytes'] / 2**30:.2f}", f"{r['step_s'] * 1e3:.1f} ({r['step_s_cv']:.1%})",
                     f"{r['wall_s']:.0f}"]
        else:
            cells = ["-"] * 5 + [f"{r['wall_s']:.0f}" if "wall_s" in r else "-"]
            notes.append(f"- {row['name']}: {row['status']}: {row.get('reason', '')}"[:400])
        lines.append("| " + " | ".join([row["name"], row["status"], *cells, row["cache"]]) + " |")
    return "\n".join(lines + (["", *notes] if notes else []))


def report(out_dir: Path, env: dict[str, Any], args: argparse.Namespace, tests: dict[str, Any] | None,
           rows: list[dict[str, Any]], study: dict[str, Any] | None, wall_s: float) -> str:
    knobs = "\n".join(f"- {r['name']}: `{' '.join(f'{k}={v}' for k, v in r['knobs'].items())}`"
                      + (f" ({r['note']})" if r["note"] else "") for r in rows)
    rest = [r["name"] for r in rows if r["status"] == "not run"]
    text = [
        f"# gpu_check: {env['device_name']}, torch {env['torch']}",
        "",
        f"Command: `{env['command']}`",
        "",
        f"{env['date']}; Python {env['python']}; CUDA {env.get('cuda')}; triton {env.get('triton', '-')}; "
        f"transformers {env.get('transformers', '-')}; {env['cpus']} CPUs; commit {env.get('git_commit') or '-'}; "
        f"driver/GPU: {env.get('nvidia_smi', '-')}; whole check {wall_s:.0f} s.",
        "",
        "## CUDA tests",
        "",
        f"`{tests['command']}`: exit {tests['exit_code']}, {tests['summary']} ({tests['seconds']} s)" if tests
        else "not run (--skip-tests)",
        "",
        f"## {args.model}, batch {args.batch_size} x {args.seq_len}, one trial per configuration",
        "",
        "Each a fresh torchrun process tree, cold inductor cache unless the cache column says warm; "
        f"{args.windows} timed windows of {args.window_steps} steps after the warm-up; tokens/s is the median "
        "window; compile s is the warm-up's time beyond what those steps take at steady state; peak memory is "
        "torch.cuda.max_memory_allocated (process max RSS on a CPU); MFU against the device's dense bf16 peak.",
        "",
        table(rows),
        "",
        knobs,
    ]
    if rest:
        text += ["", "Not run for time: `bash scripts/gpu_check.sh --skip-tests --skip-study "
                 f"--only {','.join(rest)} --name rest`"]
    text += ["", "## Study", ""]
    if study and "counts" in study:
        text.append(f"`{study['command']}`: {study['status']} in {study['seconds']} s; {study['study']}: "
                    f"{study['counts']}; stopped: {study['stop_reason']}; best: {study['best']} "
                    f"(compiled {study['best_compiled']})")
    else:
        text.append(f"{(study or {}).get('status', 'not run (--skip-study)')}: {(study or {}).get('reason', '')}"
                    f" (study.log)")
    return "\n".join(text) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=510.0, help="the whole call's time limit")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--model", default="gpt2", help="a conf/model name for the benchmark")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=5)
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(),
                        help=f"comma-separated configurations (of {', '.join(c.name for c in CONFIGS)})")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--tests-s", type=float, default=150.0)
    parser.add_argument("--skip-study", action="store_true")
    parser.add_argument("--study-s", type=float, default=90.0)
    parser.add_argument("--study-trials", type=int, default=4)
    parser.add_argument("--study-model", default="gpt2-tiny")
    parser.add_argument("--out", type=Path, help="results folder (default: $OUT, else benchmarks/results/<device>)")
    parser.add_argument("--name", default="gpu_check", help="file name of the table and numbers (NAME.md, NAME.json)")
    parser.add_argument("--work", type=Path, help="trial directories and caches (default: a new temporary folder)")
    args = parser.parse_args()
    clock = Clock(args.budget_s)
    # Trials and the study import this tree's package whatever the caller's directory.
    os.chdir(ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    unknown = args.only - {c.name for c in CONFIGS}
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(sorted(unknown))}")

    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(args.device)
    out_dir = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                           ROOT / "benchmarks" / "results" / device_slug(env, args.device))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{args.name}_trials.log").unlink(missing_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log(f"{env['device_name']}, torch {env['torch']}, results in {out_dir}, trials in {work}, "
        f"budget {args.budget_s:.0f} s")

    tests = None if args.skip_tests else run_tests(clock, args.tests_s, out_dir)
    study_reserve = 0.0 if args.skip_study else args.study_s
    rows = bench(args, clock, out_dir, work, study_reserve)
    study = None if args.skip_study else run_study(args, clock, out_dir, work)

    wall_s = time.time() - clock.start
    text = report(out_dir, env, args, tests, rows, study, wall_s)
    (out_dir / f"{args.name}.md").write_text(text)
    (out_dir / f"{args.name}.json").write_text(json.dumps(
        {"environment": env, "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
         "tests": tests, "bench": rows, "study": study, "wall_s": wall_s}, indent=1, default=str))
    print("\n" + text, flush=True)
    ok = ((tests is None or tests["exit_code"] == 0)
          and all(r["status"] in ("ok", "skipped", "not run") for r in rows)
          and (study is None or study["status"] in ("ok", "not run")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
