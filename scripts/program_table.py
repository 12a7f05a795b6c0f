"""The tabular benchmark's table: every configuration of a reduced space measured once, a row each.

Runs a real study with ``study.sampler=every`` (each configuration once, in a seeded order; no
confirmation, verdicts, pruning or warm start) on the reduced space below, then writes a CSV row per
configuration: its knobs, identity, program fingerprint, step time, cold compile time, time to train
and the trial's wall time. ``scripts/replay_search.py`` replays search strategies against it.

    python scripts/program_table.py --model gpt2-tiny --device cpu      # about an hour on 2 CPU cores
    python scripts/program_table.py --model gpt2-tiny --device cpu --export-only   # CSV from the study

The reduced space fixes the knobs that ``benchmarks/recipes/count_programs.py`` found to vary inside groups of
identical programs (``compile.fullgraph``, ``placement.order``, ``amp.placement``) and, to keep the
table within an hour here, inductor's mode and the regional granularity. Interrupted, the same
command resumes the study (its journal is in ``--output-root``).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace
from autocompile.study.records.objective import time_to_train
from autocompile.study.records.record import Measurement, TrialRecord

ROOT = Path(__file__).resolve().parent.parent
REDUCED = {"compile.mode": "default", "compile.granularity": "block", "compile.fullgraph": False,
           "placement.order": "to_then_compile", "amp.placement": "outside"}
"""Knobs the table fixes (the rest of the study's space is searched)."""
STUDY = {"study.sampler": "every", "study.confirm_top": 0, "study.verdicts": "none", "study.warm_start": False,
         "study.prune": False}


def overrides(args: argparse.Namespace, n_trials: int | None = None) -> list[str]:
    found = [f"+model={args.model}", f"workload.device={args.device}", f"output_root={args.output_root}",
             *(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in {**REDUCED, **STUDY}.items()),
             *args.override]
    return found + ([f"study.n_trials={n_trials}"] if n_trials else [])


def compose(args: argparse.Namespace) -> Settings:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from autocompile.app import available_models
    from autocompile.config.settings import register, settings_from

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return settings_from(hydra_compose("config", overrides=overrides(args)), available_models())


def rows(study: optuna.Study, space: SearchSpace, horizon_steps: int) -> list[dict[str, object]]:
    """A row per configuration measured by the study's search (its first trial of it)."""
    found: dict[str, dict[str, object]] = {}
    varying = [key for key in space.configurations()[0] if len({repr(c[key]) for c in space.configurations()}) > 1]
    for t in study.get_trials(deepcopy=False):
        record = TrialRecord.of(t)
        if record.identity is None or record.identity in found or not t.state.is_finished() or record.interrupted:
            continue
        own = Measurement.from_dict(json.loads((Path(record.trial_dir) / "result.json").read_text())) \
            if record.trial_dir and (Path(record.trial_dir) / "result.json").is_file() else Measurement()
        program = record.result or own  # a configuration stopped as another's program: that program's steps
        row: dict[str, object] = {key: record.config.get(key, "") for key in varying}
        row.update(trial=t.number, identity=record.identity, status=own.status or "failed",
                   failure=own.failure or "", fingerprint=own.fingerprint or program.fingerprint or "",
                   same_program_as=record.same_program_as if record.same_program_as is not None else "",
                   step_ms=round(program.step_s * 1e3, 4) if program.step_s else "",
                   compile_s=round(own.compile_s, 3) if own.compile_s is not None else "",
                   time_to_train_s=round(time_to_train(own.compile_s, program.step_s, horizon_steps), 3)
                   if own.compile_s is not None and program.step_s else "",
                   wall_s=round(own.wall_s, 2) if own.wall_s else "")
        found[record.identity] = row
    return sorted(found.values(), key=lambda r: r["trial"])  # type: ignore[arg-type,return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-tiny", help="a conf/model/NAME.yaml")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output-root", default="runs/program_table", help="where the study runs (resumable)")
    parser.add_argument("--out", help="the CSV (default benchmarks/tables/MODEL-DEVICE.csv)")
    parser.add_argument("--export-only", action="store_true", help="write the CSV from the study as it stands")
    parser.add_argument("--override", action="append", default=[],
                        help="a further Hydra override: a custom model's settings, or a knob fixed to shrink the space")
    parser.add_argument("--name", help="the table's name (default MODEL-DEVICE)")
    parser.add_argument("--size-only", action="store_true", help="print the space's size and stop")
    args = parser.parse_args()
    args.output_root = str(Path(args.output_root).resolve())
    settings = compose(args)
    space = SearchSpace(settings.env, settings.fixed_knobs)
    if args.size_only:
        print(f"{space.size()} configurations")
        return
    if not args.export_only:
        subprocess.run([sys.executable, "-m", "autocompile", *overrides(args, space.size())], cwd=ROOT, check=True)
    run_dir = Path(args.output_root) / settings.study.name
    journal = optuna.storages.journal.JournalFileBackend(str(run_dir / "optuna.journal"))
    storage = optuna.storages.JournalStorage(journal)
    study = optuna.load_study(study_name=settings.study.name, storage=storage)
    table = rows(study, space, settings.objective.horizon_steps)
    out = Path(args.out or ROOT / "benchmarks" / "tables" / f"{args.name or args.model}-{args.device}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    meta = {"model": args.model, "device": args.device, "fixed": REDUCED, "overrides": args.override,
            "memory_budget": settings.env.memory_budget,
            "configurations": space.size(),
            "rows": len(table), "horizon_steps": settings.objective.horizon_steps,
            "command": " ".join(["python scripts/program_table.py", *sys.argv[1:]]),
            "study": str(run_dir), "environment": next((Measurement.from_dict(
                TrialRecord.of(t).result.to_dict() if TrialRecord.of(t).result else {}).environment
                for t in study.trials if TrialRecord.of(t).result), None)}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    print(f"{out}: {len(table)} rows of {space.size()} configurations")


if __name__ == "__main__":
    main()
