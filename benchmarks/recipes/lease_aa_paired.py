"""The device lease's A/A, window by window in one process: does a timed window lose anything to a process that
compiled just before it and is paused (SIGSTOP to its whole tree, as ``trial/lease.py`` does) while it runs?

Fresh processes differ in speed on this VM by 4-20 % (``benchmarks/results/cpu-2core/issue51/README.md``), so an
A/A across processes (``lease_aa.py``) cannot resolve a few percent. Here candidate A (gpt2-tiny, module compile,
built and compiled in this process with the trial worker's own functions) times its windows one after another,
and a second process B compiles other candidates (``task=measure`` of a train-step compile, fresh caches, one after
another). Each round times four windows of A in a seeded random order, each after the same 1.5 s pause of A:

- ``alone``, twice (``alone``, ``alone2``): B stays paused throughout. Their ratio is the A/A of the design itself.
- ``paused``: B runs during A's pause, then is paused 80 ms (the lease's settle) before A's window, as the lease
  grants a turn. Against ``alone``, what the lease leaves of B's compile in a timed window.
- ``beside``: B runs through A's window (no lease): the positive control, how much the design sees when nothing
  keeps the timing alone.

Printed: each ratio's mean over rounds with its 95 % t interval (paired by round, log scale).

    python benchmarks/recipes/lease_aa_paired.py --rounds 60 \
        --out benchmarks/results/cpu-2core/issue51/lease_aa_paired.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from hydra import compose, initialize_config_dir
from scipy import stats

from autocompile.app import available_models
from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import register, settings_from
from autocompile.trial.program.build import build_candidate, period, stage, start_process, warm_up, warmup_steps
from autocompile.trial.program.build import window_steps as steps_per_window
from autocompile.trial.timing.clock import WindowClock

ROOT = Path(__file__).resolve().parents[2]
A = ["+model=gpt2-tiny", "compile.scope=module"]
B = ["+model=gpt2-tiny", "task=measure", "compile.scope=train_step", "tracking.enabled=false"]
RUN_S = 1.5
"""A's pause before each window: B compiles in it for ``paused`` and ``beside``."""
SETTLE_S = 0.08
"""The lease's wait between pausing the others and granting the turn (``trial.lease.SETTLE_S``)."""
ARMS = ("alone", "alone2", "paused", "beside")


class Compiler:
    """Process B: one ``task=measure`` after another with inductor's caches off, paused and resumed as a tree."""

    def __init__(self, root: Path) -> None:
        self.root, self.count, self.proc = root, 0, None
        self.env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
                    "AUTOCOMPILE_LEASE_DIR": str(root / "lease")}  # B's own lease: nothing of it waits on A
        self.start()
        self.stop()

    def start(self) -> None:
        self.count += 1
        self.proc = psutil.Popen([sys.executable, "-m", "autocompile", *B, f"output_root={self.root}/b{self.count}"],
                                 cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.proc, *self.proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def signal(self, sig: int) -> None:
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    def run(self) -> None:
        if self.proc.poll() is not None:  # it finished its measurement: the next candidate
            self.start()
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        self.signal(signal.SIGSTOP)

    def close(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        self.proc.wait(30)


def candidate() -> tuple[Any, int]:
    """A, built and warmed up as the trial worker does it; returns it with its window's steps."""
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        settings = settings_from(compose("config", overrides=A), available_models())
    config = TrialConfig.from_flat(dict(a.split("=") for a in A[1:]), settings.env)
    spec = settings.trial_spec(config)
    device = start_process(spec.threads, torch.device("cpu"), 1)
    built = build_candidate(spec, config, device, 0, 1)
    built.staged = stage(built.data, period(spec), device)
    warm_up(built, warmup_steps(spec), lambda: None, lambda *a, **k: None)
    return built, steps_per_window(spec, spec.measure.window_steps)


def interval(logs: list[float]) -> dict[str, float]:
    m, n = statistics.fmean(logs), len(logs)
    h = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return {"ratio": math.exp(m), "low": math.exp(m - h), "high": math.exp(m + h)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--windows", type=int, default=4, help="windows of A per arm and round, one after another")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    built, steps = candidate()
    clock = WindowClock(torch.device("cpu"), lambda: None)
    built.run(steps)  # one window untimed: the first after the warm-up
    rng = random.Random(args.seed)
    rows: list[dict[str, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="autocompile-lease-aa-") as tmp:
        b = Compiler(Path(tmp))
        try:
            for r in range(args.rounds):
                row: dict[str, list[float]] = {}
                for arm in rng.sample(ARMS, len(ARMS)):
                    if arm in ("paused", "beside"):
                        b.run()
                    time.sleep(RUN_S)
                    if arm == "paused":
                        b.stop()
                    time.sleep(SETTLE_S)
                    row[arm] = []
                    for _ in range(args.windows):  # as a turn times its windows: one after another
                        clock.start()
                        built.run(steps)
                        row[arm].append(clock.seconds[clock.stop()] / steps)
                    b.stop()
                rows.append(row)
                print(f"round {r}: " + ", ".join(f"{k} {statistics.fmean(row[k]) * 1e3:.2f}" for k in ARMS)
                      + " ms/step", flush=True)
        finally:
            b.close()
    # Per arm and round: the mean of its windows, and its first window alone (the one nearest B's run).
    summary: dict[str, Any] = {
        which: {arm: interval([math.log(pick(row[arm]) / pick(row["alone"])) for row in rows]) for arm in ARMS[1:]}
        for which, pick in (("windows", statistics.fmean), ("first_window", lambda w: w[0]))}
    summary.update(rounds=args.rounds, windows_per_arm=args.windows, window_steps=steps, b_measurements=b.count,
                   alone_ms=statistics.median(statistics.fmean(row["alone"]) for row in rows) * 1e3)
    print(f"\n{args.rounds} rounds of {args.windows} windows of {steps} steps per arm; B ran {b.count} measurements")
    for which in ("windows", "first_window"):
        for arm in ARMS[1:]:
            s = summary[which][arm]
            print(f"{which:>12} {arm:>6} / alone: {s['ratio']:.3f} [{s['low']:.3f}, {s['high']:.3f}] (95% t)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"argv": sys.argv, "a": A, "b": B, "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
