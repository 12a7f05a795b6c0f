"""Where a trial's wall time goes, and how repeatable one configuration's step time is.

Runs each configuration `--repeats` times, each in a fresh torchrun process tree with a cold
inductor cache, side by side in one invocation, and prints medians:

    python benchmarks/recipes/bench_trial.py --model gpt2-tiny --repeats 3
    python benchmarks/recipes/bench_trial.py --model gpt2 --device cuda --batch-size 8 --seq-len 1024 \
        --config "amp.dtype=bfloat16" --config "amp.dtype=bfloat16 compile.mode=reduce-overhead" \
        --config "amp.dtype=bfloat16 compile.mode=max-autotune" --json benchmarks/results/gpt2_h100.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from autocompile.app import CONF_DIR
from autocompile.config.knobs import Env, TrialConfig, describe
from autocompile.config.settings import model_spec
from autocompile.config.spec import MeasureSettings, TrialSpec, Workload
from autocompile.trial.launcher import launch
from autocompile.trial.timeline import wall_split
from autocompile.trial.timing.result import TrialResult


def parse_knobs(text: str) -> dict[str, object]:
    return {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in text.split())}


def row(name: str, values: list[float], fmt: str = ".2f") -> None:
    print(f"{name:<22}" + "".join(f"{v:>10{fmt}}" for v in values) + f"{statistics.median(values):>10{fmt}}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-tiny", help="a conf/model name")
    parser.add_argument("--config", action="append", help="knobs as 'key=value key=value' (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-steps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args()

    model = model_spec(yaml.safe_load((CONF_DIR / "model" / f"{args.model}.yaml").read_text()), [])
    workload = Workload(batch_size=args.batch_size, seq_len=[args.seq_len], device=args.device)
    device = workload.resolved_device()
    base = TrialSpec(knobs={}, model=model, workload=workload, device=device, threads=workload.resolved_threads(),
                         measure=MeasureSettings(windows=args.windows, window_steps=args.window_steps, timeout_s=1800))
    env = Env.detect(device, 1, False)
    configs = [TrialConfig.from_flat(parse_knobs(c), env) for c in (args.config or ["compile.scope=module"])]
    root = Path(tempfile.mkdtemp(prefix="autocompile-bench-"))
    report = []
    for i, config in enumerate(configs):
        runs = []
        for r in range(args.repeats):
            spec = dataclasses.replace(base, knobs=config.flat())
            result = launch(root / f"c{i}-r{r}", spec).to_json()
            if result["status"] != "ok":
                print(f"{describe(config, env)} repeat {r}: {result['status']}: {result.get('reason')}")
                continue
            runs.append(result)
        report.append({"config": config.active(env), "runs": runs})
        if not runs:
            continue
        print(f"\n== {describe(config, env)}  ({args.model}, bs {args.batch_size}, seq {args.seq_len}, {device}, "
              f"torch {runs[0]['environment']['torch']}, {runs[0]['environment']['device_name']})")
        splits = [wall_split(TrialResult.from_json(r)) for r in runs]
        print(f"{'phase':<22}" + "".join(f"{'run ' + str(k):>10}" for k in range(len(runs))) + f"{'median':>10}")
        for phase in splits[0]:
            row(phase, [s[phase] for s in splits])
        row("wall_s", [r["wall_s"] for r in runs])
        row("compile_s (estimate)", [r["compile_s"] for r in runs])
        steps = [r["step_s"] * 1e3 for r in runs]
        row("step_ms (median)", steps, ".3f")
        row("window CV %", [r["step_s_cv"] * 100 for r in runs], ".1f")
        row("tokens/s", [r["tokens_per_s"] for r in runs], ".0f")
        if len(steps) > 1:
            spread = statistics.pstdev(steps) / statistics.fmean(steps)
            print(f"step time across repeats: CV {spread:.1%}, max/min {max(steps) / min(steps):.3f}")
        mfu = [r["mfu"] for r in runs if r.get("mfu") is not None]
        if mfu:
            print(f"MFU median {statistics.median(mfu):.1%}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"argv": sys.argv, "results": report}, indent=1, default=str))
    print(f"\ntrial directories: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
