"""Validate the GPU path: the CUDA tests, GPT-2 124M under the main configurations, a short study.

The device machine allows 10 minutes per command, so the check is three commands of at most 9 minutes, 25
minutes together with their installs; ``--dry-run`` lists them with every stage, check and budget (it imports
no torch and runs anywhere). On the GPU box (torch there, the tuner's other packages carried as wheels in .whl/,
see scripts/prepare_wheels.sh), through the wrapper that installs them first:

    python scripts/gpu_check.py --dry-run                 # the plan: commands, stages, checks, budgets
    bash scripts/gpu_check.sh --stage tests,tf32           # command 1: CUDA tests, fp32 TF32 pairs
    bash scripts/gpu_check.sh --stage table                # command 2: the GPT-2 124M table
    bash scripts/gpu_check.sh --stage autotune,study       # command 3: max-autotune, a short study
    python scripts/gpu_check.py --merge benchmarks/results/<device>   # here: one gpu_check.md of all three

Anywhere (the flow on a CPU, CUDA-only configurations skipped; no --stage: every stage):

    python scripts/gpu_check.py --device cpu --model gpt2-tiny --batch-size 2 --seq-len 64 --only eager,default

Each command writes to ``$OUT`` if set, else ``benchmarks/results/<device>/``, to commit as it is:
``NAME.md`` (its report), ``NAME.json`` (every number), ``pytest.log`` and ``pytest.xml``, ``study.log``,
``NAME_trials.log`` (the stderr tail of each trial that did not finish); NAME is ``gpu_check-<stages>``.

Time: stages run one after another, never side by side (concurrent compiles would distort the compile times
measured). Each has a budget (gpu_check_plan.STAGES); the tests and the table may use what earlier stages of the
command left, never more than the command's sum (the study keeps to its own), and each keeps ``KILL_GRACE_S``
for being stopped. Each configuration is a trial in a fresh torchrun process tree with a cold inductor cache,
time-boxed by ``measure.timeout_s`` = min(its cap, time left); one that no longer fits (< 30 s left) is listed
as not run, with the command that measures the rest.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere: the scripts import the package of this tree
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_plan import (  # noqa: E402
    CONFIGS,
    CUDA_TESTS,
    KILL_GRACE_S,
    STAGES,
    TEST_WORKERS,
    Stage,
    check_plan,
    dry_run,
)
from gpu_check_report import check_results, describe_row, junit_outcomes, log_outcomes, merge, report  # noqa: E402

MIN_TRIAL_S = 30.0
"""A configuration is not started with less time left than this: it could not even finish its imports."""


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


def triton_pin() -> str:
    """The Triton that torch's wheel pins against the one installed (issue 27 finding 8)."""
    from importlib import metadata

    pins = [r.split(";")[0].strip() for r in metadata.requires("torch") or []
            if re.match(r"(pytorch-)?triton\b", r)]
    if not pins:
        return "torch pins no triton"
    name, _, want = pins[0].partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return f"torch pins {pins[0]}, not installed"
    return f"torch pins {pins[0]}: " + ("ok" if not want or have == want else f"MISMATCH, {have} installed")


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "hostname": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": os.environ.get("GPU_CHECK_COMMAND") or shlex.join([sys.executable, *sys.argv]),
    }
    for package in ("triton", "transformers", "optuna", "hydra", "omegaconf"):
        if importlib.util.find_spec(package) is not None:
            with contextlib.suppress(Exception):
                env[package] = __import__(package).__version__
    with contextlib.suppress(Exception):
        env["triton_pin"] = triton_pin()
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


def run_tests(deadline: float, out_dir: Path, tests_k: str = "") -> dict[str, Any]:
    """``pytest -m cuda``: pass/fail of every GPU-only path, and of each check of the plan."""
    timeout = deadline - KILL_GRACE_S - time.time()
    # -v: each test's outcome is in the log as it ends, so a run stopped at its budget still says what passed.
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-m", "cuda", "-v", "-rs",
           "--tb=short", "--junitxml", str(out_dir / "pytest.xml"), CUDA_TESTS, *(["-k", tests_k] if tests_k else [])]
    if importlib.util.find_spec("pytest_timeout"):
        cmd += ["--timeout", str(int(max(1.0, timeout)))]
    if importlib.util.find_spec("xdist"):
        cmd += ["-n", str(TEST_WORKERS), "--dist", "load"]  # processes share the GPU; the compiles use the cores
    if importlib.util.find_spec("pytest_benchmark"):
        cmd += ["-p", "no:benchmark"]
    log(f"CUDA tests (at most {timeout:.0f} s)")
    started = time.time()
    code, output = run_bounded(cmd, timeout, out_dir / "pytest.log")
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)),
                   lines[-1] if lines else "")
    checks = check_results(ROOT, junit_outcomes(out_dir / "pytest.xml") or log_outcomes(output))
    log(f"CUDA tests: exit {code}: {summary}")
    for c in checks:
        log(f"  {c['result']:<18} {c['what'][:90]}")
    return {"exit_code": code, "summary": summary, "seconds": round(time.time() - started, 1),
            "command": shlex.join(cmd), "checks": checks}


def bench(args: argparse.Namespace, stage: Stage, deadline: float, out_dir: Path, work: Path) -> list[dict[str, Any]]:
    import dataclasses

    import yaml

    from autocompile.app import CONF_DIR
    from autocompile.config.knobs import Env, TrialConfig
    from autocompile.config.settings import model_spec
    from autocompile.config.spec import MeasureSettings, TrialSpec, Workload
    from autocompile.trial.launcher import launch

    node = yaml.safe_load((CONF_DIR / "model" / f"{args.model}.yaml").read_text())
    node = node.get("model", node) if "_target_" not in node else node  # gpt2.yaml is a _global_ package
    model = model_spec({k: v for k, v in node.items() if k != "defaults"}, [])
    fields = {f.name for f in dataclasses.fields(Workload)}
    env = Env.detect(args.device, 1, False)
    rows: list[dict[str, Any]] = []
    for c in (c for c in stage.configs if not args.only or c.name in args.only):
        row: dict[str, Any] = {"name": c.name, "knobs": c.knobs, "note": c.note, "cache": "-",
                               "workload": {f"workload.{k}": v for k, v in c.workload.items()}}
        rows.append(row)
        left = deadline - KILL_GRACE_S - time.time()
        missing = set(c.workload) - fields
        if c.cuda_only and args.device != "cuda":
            row |= {"status": "skipped", "reason": "needs CUDA"}
            continue
        if missing:
            row |= {"status": "skipped", "reason": f"workload.{', '.join(sorted(missing))} not in this tree"}
            continue
        if left < MIN_TRIAL_S:
            row |= {"status": "not run", "reason": f"time budget ({left:.0f} s left)"}
            continue
        workload = Workload(batch_size=args.batch_size, seq_len=[args.seq_len], device=args.device, **c.workload)
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
        log(f"{c.name}: {', '.join(f'{k}={v}' for k, v in {**c.knobs, **row['workload']}.items())} "
            f"(at most {timeout:.0f} s)")
        result = launch(work / "trials" / c.name, spec, cache_dir=cache).to_json()  # the record kept
        row |= {"status": result["status"], "timeout_s": round(timeout), "result": result}
        if result["status"] != "ok":
            row["reason"] = f"{result.get('failure', result['status'])}: {result.get('reason', '')}"
            tail = work / "trials" / c.name / "stderr.log"
            with open(out_dir / f"{args.name}_trials.log", "a") as f:
                f.write(f"===== {c.name}: {row['reason']}\n")
                if tail.exists():
                    f.write("\n".join(tail.read_text(errors="replace").splitlines()[-60:]) + "\n")
        log(f"{c.name}: {describe_row(row)}")
    return rows


def run_study(args: argparse.Namespace, stage: Stage, deadline: float, out_dir: Path, work: Path) -> dict[str, Any]:
    """A short study end to end: Hydra, Optuna, the trial loop, the report (MLflow off: not carried)."""
    # Its own budget at most: the study fills whatever study.timeout_s it is given, time left over is not its.
    timeout = min(stage.budget_s, deadline - time.time()) - KILL_GRACE_S
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


def parse_args() -> argparse.Namespace:
    names = [s.name for s in STAGES]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests-k", default="", help="pytest -k expression: run only these CUDA tests")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (commands, stages, budgets) and exit")
    parser.add_argument("--merge", type=Path, metavar="DIR", help="write DIR/gpu_check.md from DIR/gpu_check-*.json")
    parser.add_argument("--stage", type=lambda s: tuple(s.split(",")), default=tuple(names),
                        help=f"comma-separated stages to run, of {','.join(names)} (default: all)")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--model", default="gpt2", help="a conf/model name for the table")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=5)
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(),
                        help=f"comma-separated configurations (of {', '.join(c.name for c in CONFIGS)})")
    parser.add_argument("--study-trials", type=int, default=4)
    parser.add_argument("--study-model", default="gpt2-tiny")
    parser.add_argument("--out", type=Path, help="results folder (default: $OUT, else benchmarks/results/<device>)")
    parser.add_argument("--name", help="file name of the report and numbers (default: gpu_check-<stages>)")
    parser.add_argument("--work", type=Path, help="trial directories and caches (default: a new temporary folder)")
    args = parser.parse_args()
    unknown = (set(args.stage) - set(names)) | (args.only - {c.name for c in CONFIGS})
    if unknown:
        parser.error(f"unknown stage(s) or configuration(s) {', '.join(sorted(unknown))}")
    args.stage = tuple(n for n in names if n in args.stage)  # always in plan order
    args.name = args.name or "gpu_check-" + "-".join(args.stage)
    return args


def main() -> int:
    args = parse_args()
    if args.dry_run:
        problems = check_plan()
        print(dry_run(ROOT) + "".join(f"\nPLAN PROBLEM: {p}" for p in problems), flush=True)
        return 1 if problems else 0
    if args.merge:
        print(merge(args.merge), flush=True)
        return 0
    start = time.time()
    # Trials and the study import this tree's package whatever the caller's directory.
    os.chdir(ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(args.device)
    out_dir = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                           ROOT / "benchmarks" / "results" / device_slug(env, args.device))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{args.name}_trials.log").unlink(missing_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    stages = [s for s in STAGES if s.name in args.stage]
    log(f"{env['device_name']}, torch {env['torch']}, results in {out_dir}, trials in {work}, stages "
        + ", ".join(f"{s.name} ({s.budget_s:.0f} s)" for s in stages))

    tests, study, rows = None, None, []
    deadline = start
    for s in stages:
        deadline += s.budget_s  # what an earlier stage left over goes to the next
        if s.name == "tests":
            tests = run_tests(deadline, out_dir, args.tests_k)
        elif s.configs:
            rows += bench(args, s, deadline, out_dir, work)
        else:
            study = run_study(args, s, deadline, out_dir, work)

    wall_s = time.time() - start
    plain = {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}
    text = report(env, plain, tests, rows, study, wall_s, [env["command"]])
    (out_dir / f"{args.name}.md").write_text(text)
    (out_dir / f"{args.name}.json").write_text(json.dumps(
        {"environment": env, "args": plain, "tests": tests, "bench": rows, "study": study, "wall_s": wall_s},
        indent=1, default=str))
    print("\n" + text, flush=True)
    # On a GPU every check must have a test that passed: one with none, or only skipped ones, proved nothing.
    unproved = [c["what"] for c in (tests or {}).get("checks", []) if "passed" not in c["result"]]
    if unproved and args.device == "cuda":
        log(f"{len(unproved)} check(s) without a passed test: " + "; ".join(w[:60] for w in unproved))
    ok = ((tests is None or (tests["exit_code"] == 0 and not (unproved and args.device == "cuda")))
          and all(r["status"] in ("ok", "skipped", "not run") for r in rows)
          and (study is None or study["status"] in ("ok", "not run")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
