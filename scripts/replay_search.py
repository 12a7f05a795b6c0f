"""The tabular benchmark: search strategies replayed against a table of measured programs, many seeds each.

For each strategy and seed, a real Optuna study with that sampler runs against the table
(``autocompile.study.replay``, any table ``scripts/program_table.py`` wrote): trials are answered from
their configuration's row with the noise the records show (``--noise-*``; defaults and their sources:
``autocompile.study.replay.Noise``), pruned by the tuner's own stop rule (``--no-prune``), the
recommendation raced by the confirmation's tie rule, and cost the row's wall time. After the trials, the
near-miss prunes are measured once more (``--remeasure-pruned``, as ``study.remeasure_pruned``). Reported:
trials and simulated wall time until the recommended program (the confirmation's pick among the best measured
so far: ``--confirm-top``) is within ``--tolerance`` of the table's best time to train, and its curves (median and
quartiles of the recommendation's regret over the seeds).

    python scripts/replay_search.py --table benchmarks/tables/gpt2-tiny-cpu.csv --seeds 50
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from program_table import REDUCED, compose

from autocompile.config.sections import StudySettings
from autocompile.config.space import SearchSpace
from autocompile.study.replay import Noise, Replay, best_time_to_train, load_table, replay
from autocompile.study.search.samplers import make_sampler
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE

SAMPLERS = ("random", "tpe", "staged")
"""The default strategies compared; ``gp`` too with ``--samplers random tpe staged gp`` (slower to replay)."""


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Quartiles that allow infinity (a seed that never got there): no interpolation between values."""
    q = np.quantile(np.array(values, dtype=float), [0.25, 0.5, 0.75], method="inverted_cdf")
    return float(q[0]), float(q[1]), float(q[2])


def regret_at(run: Replay, wall_s: float, best_s: float) -> float:
    """The recommendation's regret (true time to train over the best, minus 1) at simulated time ``wall_s``."""
    value = math.inf
    for w, r in zip(run.wall_s, run.recommended_s, strict=True):
        if w > wall_s:
            break
        value = r
    return value / best_s - 1


def plot(curves: dict[str, list[Replay]], best_s: float, horizon_min: float, title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(0, horizon_min * 60, 241)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name, runs in curves.items():
        per_t = [[regret_at(r, t, best_s) * 100 for r in runs] for t in grid]
        q = np.array([quartiles(v) for v in per_t])
        ax.plot(grid / 60, q[:, 1], label=f"{name} (median)")
        ax.fill_between(grid / 60, q[:, 0], q[:, 2], alpha=0.2)
    ax.axhline(2, color="grey", linestyle="--", linewidth=0.8, label="2 % of the best")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(0, 100)
    ax.set_xlabel("simulated wall time of the search (min)")
    ax.set_ylabel("recommended program's time to train\nover the table's best (%)")
    ax.set_title(f"{title}: {len(next(iter(curves.values())))} seeds each; band: quartiles", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a replay makes thousands of in-memory trials
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=Path("benchmarks/tables/gpt2-tiny-cpu.csv"))
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--trials", type=int, default=60, help="trials per replayed study")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--budgets", type=int, nargs="*", default=[4, 8, 20],
                        help="study.n_trials values: in how many seeds the recommendation after that many trials is "
                             "within --tolerance of the table's best")
    parser.add_argument("--horizon-steps", type=int, help="objective.horizon_steps (default: the table's)")
    parser.add_argument("--confirm-top", type=int, default=StudySettings.confirm_top,
                        help="as study.confirm_top: 0 recommends the search's best single measurement")
    parser.add_argument("--plot", type=Path, help="a PNG of the curves")
    defaults = Noise()
    parser.add_argument("--noise-step", type=float, default=defaults.step,
                        help="step time of one alone process (lognormal sigma)")
    parser.add_argument("--noise-compile", type=float, default=defaults.compile, help="cold compile time")
    parser.add_argument("--noise-confirm", type=float, default=defaults.confirm,
                        help="a candidate's step time within one side-by-side confirmation process")
    parser.add_argument("--noise-window", type=float, default=defaults.window,
                        help="the first timed window against its process (what pruning reads)")
    parser.add_argument("--processes", type=int, default=defaults.processes, help="confirmation processes")
    parser.add_argument("--no-prune", action="store_true", help="as study.prune=false")
    parser.add_argument("--remeasure-pruned", type=int, default=StudySettings.remeasure_pruned,
                        help="as study.remeasure_pruned: near-miss prunes measured once more after the trials")
    parser.add_argument("--tie-margin", type=float, help="objective.tie_margin (default: its default)")
    parser.add_argument("--staged-margin", type=float, default=PRIOR_ALONE_NOISE,
                        help="staged: a one-knob change is kept only when it measured better by more than this")
    args = parser.parse_args()
    meta = json.loads(args.table.with_suffix(".json").read_text())
    if meta["fixed"] != REDUCED:
        sys.exit(f"{args.table} was measured on the space {meta['fixed']}, not {REDUCED}: regenerate it")
    settings = compose(argparse.Namespace(model=meta["model"], device=meta["device"], output_root="runs/program_table",
                                          override=meta.get("overrides", [])))
    # A table measured before ac.policy offered compile's memory budgets has no rows for them: its space without.
    env = dataclasses.replace(settings.env, memory_budget=bool(meta.get("memory_budget")))
    space = SearchSpace(env, settings.fixed_knobs)
    table = load_table(args.table)
    horizon = args.horizon_steps or meta["horizon_steps"]
    best_s = best_time_to_train(table, horizon)
    print(f"table {args.table}: {len(table)} configurations ({sum(r.ok for r in table.values())} ran), "
          f"best time to train {best_s:.1f} s over {horizon} steps; within {args.tolerance:.0%}: "
          f"{sum(r.ok and r.compile_s + horizon * r.step_s <= best_s * (1 + args.tolerance) for r in table.values())}"
          f"; measuring all of it took {sum(r.wall_s for r in table.values()) / 60:.0f} min")
    noise = Noise(args.noise_step, args.noise_compile, args.noise_confirm, args.noise_window, args.processes)
    print(f"noise: step time {noise.step:.1%}, compile time {noise.compile:.1%}, first window {noise.window:.1%}, "
          f"confirmation {noise.confirm:.1%} per process x {noise.processes} (lognormal sigma); pruning "
          f"{'off' if args.no_prune else 'as the tuner'}; staged margin {args.staged_margin:.1%}; confirm_top "
          f"{args.confirm_top}; {args.seeds} seeds x {args.trials} trials per strategy")
    curves: dict[str, list[Replay]] = {}
    for name in args.samplers:
        started = time.time()
        curves[name] = [replay(space, table, make_sampler(name, space, seed, margin=args.staged_margin), args.trials,
                               horizon, noise, seed, confirm_top=args.confirm_top, prune=not args.no_prune,
                               tie_margin=args.tie_margin, remeasure_pruned=args.remeasure_pruned)
                          for seed in range(args.seeds)]
        hits = [r.first_within(best_s, args.tolerance) for r in curves[name]]
        reached = [h for h in hits if h is not None]
        trials = quartiles([h[0] if h else math.inf for h in hits])
        walls = quartiles([h[1] / 60 if h else math.inf for h in hits])
        final = quartiles([r.recommended_s[-1] / best_s * 100 - 100 for r in curves[name]])
        print(f"{name:>7}: within {args.tolerance:.0%} in {len(reached)}/{len(hits)} seeds; trials to get there "
              f"median {trials[1]:g} (quartiles {trials[0]:g}-{trials[2]:g}); simulated wall median "
              f"{walls[1]:.1f} min ({walls[0]:.1f}-{walls[2]:.1f}); after {args.trials} trials "
              f"+{final[1]:.1f} % ({final[0]:.1f}-{final[2]:.1f}) [{time.time() - started:.0f} s to replay]")
        within = sum(r.recommended_s[-1] <= best_s * (1 + args.tolerance) for r in curves[name])
        before = sum(r.recommended_s[args.trials - 1] <= best_s * (1 + args.tolerance) for r in curves[name])
        pruned = statistics.fmean(sum(s.name == "PRUNED" for _, s in dict(r.states).items()) for r in curves[name])
        again = statistics.fmean(len(r.remeasured) for r in curves[name])
        completed = statistics.fmean(sum(s.name == "COMPLETE" for _, s in r.remeasured) for r in curves[name])
        extra = statistics.median(r.wall_s[-1] - r.wall_s[args.trials - 1] for r in curves[name]) / 60
        print(f"         after {args.trials} trials and the re-measures: recommendation within {args.tolerance:.0%} of "
              f"the best in {within}/{len(curves[name])} seeds ({before} before the re-measures); per seed (mean) "
              f"{pruned:.1f} configurations pruned, {again:.1f} re-measured ({completed:.1f} completed), "
              f"the re-measures' wall median {extra:.1f} min")
        for t in sorted({5, 10, 20, 40, args.trials, *args.budgets}):
            if t <= args.trials:
                at = [r.recommended_s[t - 1] / best_s * 100 - 100 for r in curves[name]]
                wall = statistics.median(r.wall_s[t - 1] for r in curves[name]) / 60
                q = quartiles(at)
                hit = sum(a <= args.tolerance * 100 for a in at)
                print(f"         after {t:>3} trials ({wall:5.1f} min): regret median {q[1]:6.1f} % "
                      f"(quartiles {q[0]:.1f}-{q[2]:.1f}); within {args.tolerance:.0%} in {hit}/{len(at)} seeds")
    if args.plot:
        horizon_min = max(statistics.median(r.wall_s[-1] for r in runs) for runs in curves.values()) / 60
        plot(curves, best_s, horizon_min, f"{args.table.name}, time to train {horizon:,} steps", args.plot)
        print(f"curves: {args.plot}")


if __name__ == "__main__":
    main()
