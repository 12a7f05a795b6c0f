"""Where a study's wall time goes, and the floor under it (issue 35).

Every process a study started, from its run directory, split into what its decisions read and what they do not:

- cold compile: a fresh process's ``compile_s`` (search trials, verdict neighbours' cold runs, the warm start):
  the objective's time to train reads it, so each program the study asks about is compiled cold once;
- warm builds: a side-by-side process building each candidate from its cold run's cache (dynamo traces again in
  every process; the process-to-process spread the intervals need comes from fresh processes);
- timed windows: what the step-time intervals read (``timed_s``; a side-by-side process's rounds);
- the rest of each process (interpreter start, imports, model and data, warm-up steps at steady speed, saving
  artifacts, teardown) and the tuner's own time between processes (Optuna, MLflow, planning, the report).

The first three are the floor of the study as its decision rules stand: no launcher, zygote or bookkeeping change
removes them; only fewer programs, fewer processes or fewer windows do, which the rules' precision prices
(``processes_and_windows.py``).

    PYTHONPATH=. python benchmarks/recipes/study_floor.py RUN_DIR [RUN_DIR ...]

RUN_DIR: a study's run directory (``OUTPUT_ROOT/gpt2-tiny-bs8-seq128-ws1-cpu``: ``optuna.journal``, ``app.log``,
``trials/``, ``phases/``).
"""

import json
import re
import sys
from datetime import datetime
from pathlib import Path

import optuna

from autocompile.study.records.record import TrialRecord

PARTS = ("processes", "wall", "cold compile", "warm builds", "timed windows", "start, imports, rest")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def load(run_dir: Path) -> optuna.Study:
    journal = optuna.storages.journal.JournalFileBackend(str(run_dir / "optuna.journal"))
    storage = optuna.storages.JournalStorage(journal)
    name, = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


def fresh(path: Path) -> dict[str, float] | None:
    """One process alone: its wall, cold compile and timed part."""
    result = path / "result.json"
    if not result.is_file():
        return None
    r = json.loads(result.read_text())
    wall = r.get("wall_s") or 0.0
    compile_s = r.get("compile_s") or 0.0
    timed = r.get("timed_s") or 0.0
    return {"processes": 1, "wall": wall, "cold compile": compile_s, "warm builds": 0.0, "timed windows": timed,
            "start, imports, rest": max(wall - compile_s - timed, 0.0)}


def side_by_side(path: Path) -> dict[str, float] | None:
    """One side-by-side process: its wall, its candidates' builds and its rounds."""
    result, progress = path / "result.json", path / "progress.jsonl"
    if not result.is_file() or not progress.is_file():
        return None
    wall = json.loads(result.read_text()).get("wall_s") or 0.0
    events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    starts = [e["time"] for e in events if e["event"] == "candidate_start"]
    ready = [e["time"] for e in events if e["event"] == "candidate_ready"]
    rounds = [e["time"] for e in events if e["event"] == "round"]
    if not starts or not ready:
        return None
    builds = sum(b - a for a, b in zip(starts, ready, strict=False))
    timed = rounds[-1] - max(ready) if rounds else 0.0
    inside = (rounds[-1] if rounds else max(ready)) - starts[0]
    return {"processes": 1, "wall": wall, "cold compile": 0.0, "warm builds": builds, "timed windows": timed,
            "start, imports, rest": max(wall - inside, 0.0) + max(inside - builds - timed, 0.0)}


def log_span(run_dir: Path) -> float | None:
    """Seconds from the study log's first line to its last."""
    log = run_dir / "app.log"
    if not log.is_file():
        return None
    stamps = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
              for line in log.read_text(errors="replace").splitlines() if (m := STAMP.match(line))]
    return stamps[-1] - stamps[0] if len(stamps) > 1 else None


def parts(run_dir: Path) -> dict[str, dict[str, float]]:
    """Seconds of each part, per phase (search, confirm, verdict, warm start), each process counted once."""
    study = load(run_dir)
    seen: set[Path] = set()
    table: dict[str, dict[str, float]] = {}

    def add(phase: str, found: dict[str, float] | None) -> None:
        if found is not None:
            row = table.setdefault(phase, dict.fromkeys(PARTS, 0.0))
            for k, v in found.items():
                row[k] += v

    if (run_dir / "reference").is_dir():
        seen.add((run_dir / "reference").resolve())
        add("search", fresh(run_dir / "reference"))
    for t in study.trials:
        rec = TrialRecord.of(t)
        if not rec.trial_dir or rec.cold_from is not None:  # a cold run that is a search trial: counted there
            continue
        path = Path(rec.trial_dir).resolve()
        if path in seen or not path.is_dir():
            continue
        seen.add(path)
        phase = rec.phase or "search"
        add(phase, side_by_side(path) if path.parent.name == "phases" else fresh(path))
    if (run_dir / "warm_start").is_dir():
        add("warm start", fresh(run_dir / "warm_start"))
    return table


def main(dirs: list[Path]) -> None:
    for run_dir in dirs:
        table = parts(run_dir)
        total = {k: sum(row[k] for row in table.values()) for k in PARTS}
        span = log_span(run_dir)
        print(f"\n## {run_dir.name}\n")
        print("| phase | " + " | ".join(PARTS) + " |")
        print("|---|" + "---|" * len(PARTS))
        for phase, row in [*table.items(), ("all processes", total)]:
            print(f"| {phase} | {row['processes']:.0f} | " + " | ".join(f"{row[k]:.0f}" for k in PARTS[1:]) + " |")
        floor = total["cold compile"] + total["warm builds"] + total["timed windows"]
        if span is not None:
            print(f"\nstudy log, first line to last: {span:.0f} s; of it outside any process (the tuner: Optuna, "
                  f"MLflow, planning, report): {span - total['wall']:.0f} s")
        print(f"floor (cold compile + warm builds + timed windows): {floor:.0f} s; start, imports and the rest of "
              f"each process: {total['start, imports, rest']:.0f} s")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
