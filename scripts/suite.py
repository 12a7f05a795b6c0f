"""The suite: the default study on every shipped family's tiny variant, one table of what each recommends.

Runs ``python -m autocompile +model=FAMILY-tiny workload.device=cpu`` (the default study, nothing else
changed) once per family, one after another, each study's output kept in a record file beside the table
(the command, machine, torch, wall time and the 1-minute load average sampled every 30 s while it ran, as
``scripts/record.sh`` records), then writes one markdown table from the studies' ``summary.json``: per
family the winner, its step time, its step time and time to train against eager and default compile
with 95% intervals (the confirmation phase's paired rounds), how many verdict questions got an answer,
the study's wall time; and the geometric mean of the winner against default compile over the suite.

    python scripts/suite.py --dry-run                 # the commands, nothing run
    python scripts/suite.py                           # every *-tiny family (hours on 2 CPU cores; run alone)
    python scripts/suite.py --families t5-tiny,resnet-tiny -- study.n_trials=4   # a subset, extra overrides
    python scripts/suite.py --table-only              # the table again from the studies already run

Run it on a quiet machine: every number is a timing, and the record files say how quiet it was.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core"


def tiny_families() -> list[str]:
    """Every shipped family's tiny variant (``conf/model/*-tiny.yaml``)."""
    return sorted(p.stem for p in (ROOT / "conf" / "model").glob("*-tiny.yaml"))


def command(family: str, output_root: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "autocompile", f"+model={family}", "workload.device=cpu",
            f"output_root={output_root}", f"study.name=suite-{family}", *extra]


@dataclass
class Loads:
    """The 1-minute load average, sampled every ``every_s`` while a study ran."""

    samples: list[float]

    def text(self) -> str:
        if not self.samples:
            return "not sampled"
        s = sorted(self.samples)
        return f"{s[0]:.2f} / {statistics.median(s):.2f} / {s[-1]:.2f} (min / median / max of {len(s)})"


@contextmanager
def sampling_load(every_s: float = 30.0) -> Iterator[Loads]:
    loads, stop = Loads([]), threading.Event()

    def sample() -> None:
        while True:
            loads.samples.append(os.getloadavg()[0])
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield loads
    finally:
        stop.set()
        thread.join()


def run_study(family: str, output_root: Path, extra: list[str], results: Path) -> None:
    """One family's study, its output and conditions in ``results/suite_FAMILY.txt``."""
    argv = command(family, output_root, extra)
    started = time.monotonic()
    with sampling_load() as loads:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    import torch

    header = [f"# Command (from the repository root): {shlex.join(['python', *argv[1:]])}",
              f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} cores, "
              f"{platform.python_version()} torch {torch.__version__}",
              f"# 1-min load average every 30 s: {loads.text()}",
              f"# exit {done.returncode}, wall {time.monotonic() - started:.0f} s", ""]
    (results / f"suite_{family}.txt").write_text("\n".join(header) + done.stdout + done.stderr)
    print(f"{family}: exit {done.returncode}, load {loads.text()}", flush=True)


def ratio_text(ratio: dict[str, Any] | None) -> str:
    """``-12.3% [-20.1, -4.0]`` (winner against a baseline; negative = the winner is faster)."""
    if not ratio:
        return "no shared round"
    if ratio.get("low") is None or ratio.get("high") is None:
        return f"{ratio['change']:+.1%} (1 round)"
    return f"{ratio['change']:+.1%} [{ratio['low'] * 100:+.1f}, {ratio['high'] * 100:+.1f}]"


def against(summary: dict[str, Any], baseline: str, kind: str) -> tuple[str, float | None]:
    """The winner against ``baseline`` (``eager`` or ``compile``): the text and the ratio (winner / baseline)
    of step time (``kind="step"``) or the objective's score (``"score"``, time to train)."""
    confirmed = summary.get("confirmed") or {}
    winner = confirmed.get("winner")
    if not winner:
        return "not confirmed", None
    if winner.get("baseline") == baseline:
        return "is the winner", 1.0
    gain = (confirmed.get("gains") or {}).get(baseline)
    if gain is None:
        return "not raced", None
    ratio = gain.get(kind)
    return ratio_text(ratio), (1.0 + ratio["change"]) if ratio else None


def verdict_rounds(summary: dict[str, Any]) -> str:
    """How the verdict phase timed the neighbours it timed (an identical program is not timed): side by side in
    fresh processes, in fresh-process rounds (candidates that could not share a process), or not at all."""
    kinds = {"side by side": 0, "fresh-process rounds": 0, "not timed": 0}
    for v in summary.get("verdicts") or []:
        how = v.get("how") or ""
        if v.get("identical") or v.get("not_asked"):
            continue
        kinds["side by side" if "side by side" in how else "fresh-process rounds" if "fresh processes" in how
              else "not timed"] += 1
    return ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n) or "-"


def race_text(confirmed: dict[str, Any]) -> str:
    """``decided``, or which candidates stayed undetermined against the winner and how many more processes
    would decide each (the confirmation's own estimate)."""
    if not confirmed:
        return "-"
    open_ = [f"{u.get('name', u.get('label', '?'))} undetermined"
             + (f" ({u['more_processes']} more processes)" if u.get("more_processes") else "")
             for u in confirmed.get("undetermined") or []]
    return "; ".join(open_) if open_ else "decided"


def decided(summary: dict[str, Any]) -> str:
    """Verdict questions answered (measurably faster or slower, the same program, or a failure) of those asked."""
    asked = [v for v in summary.get("verdicts") or [] if not v.get("not_asked")]  # study.verdicts=auto's rows
    answered = sum(bool(v.get("measurable") or v.get("identical") or v.get("failure")) for v in asked)
    return f"{answered} of {len(asked)}" if asked else "none asked"


@dataclass
class Row:
    family: str
    winner: str
    step_ms: float | None
    cells: dict[str, str]
    versus_compile: dict[str, float | None]
    """Winner / default compile: ``step`` and ``score`` (None: not raced or not confirmed)."""
    verdicts: str
    wall_s: float
    rounds: str
    """How many neighbours the verdict phase timed side by side, in fresh-process rounds, or not at all."""
    race: str
    """``decided``, or the candidates the confirmation left undetermined against the winner."""


def row(summary: dict[str, Any]) -> Row:
    confirmed = summary.get("confirmed") or {}
    winner = confirmed.get("winner") or {}
    recommended = summary.get("recommended") or {}
    step_s = winner.get("step_s_geomean") or (recommended.get("result") or {}).get("step_s")
    cells, versus = {}, {}
    for baseline in ("eager", "compile"):
        for kind in ("step", "score"):
            cells[f"{kind} vs {baseline}"], value = against(summary, baseline, kind)
            if baseline == "compile":
                versus[kind] = value
    return Row(family=summary.get("model", "?"), winner=winner.get("name") or recommended.get("name") or "none",
               step_ms=step_s * 1e3 if step_s else None, cells=cells, versus_compile=versus,
               verdicts=decided(summary), wall_s=float(summary.get("wall_s") or 0.0),
               rounds=verdict_rounds(summary), race=race_text(confirmed))


def geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def table(summaries: list[dict[str, Any]]) -> str:
    """The suite's markdown table and its geometric mean line."""
    rows = [row(s) for s in summaries]
    objective = {s.get("objective") for s in summaries}
    score = "time to train" if objective <= {"time_to_train"} else f"score ({', '.join(sorted(map(str, objective)))})"
    lines = [f"| family | winner | step (ms) | step vs eager | {score} vs eager | step vs default compile | "
             f"{score} vs default compile | race | verdicts | verdicts timed | study wall (min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = f"{r.step_ms:.2f}" if r.step_ms is not None else "-"
        lines.append(f"| {r.family} | {r.winner} | {step} | {r.cells['step vs eager']} | {r.cells['score vs eager']} "
                     f"| {r.cells['step vs compile']} | {r.cells['score vs compile']} | {r.race} | {r.verdicts} "
                     f"| {r.rounds} | {r.wall_s / 60:.1f} |")
    lines.append("")
    for kind, name in (("step", "step time"), ("score", score)):
        values = [v for r in rows if (v := r.versus_compile[kind]) is not None]
        mean = geomean(values)
        lines.append(f"Geometric mean of the winner against default compile, {name}: "
                     + (f"x{mean:.3f} ({mean - 1:+.1%}) over {len(values)} of {len(rows)} families"
                        if mean is not None else f"none of the {len(rows)} families raced default compile"))
    return "\n".join(lines) + "\n"


def document(summaries: list[dict[str, Any]], commands: list[list[str]], families: list[str],
             extra: list[str]) -> str:
    head = ["# The suite: the default study on every family's tiny variant (CPU)", "",
            "Made by `scripts/suite.py`; each family's study output, load average and wall time are in "
            f"`suite_FAMILY.txt` beside this file ({', '.join(families)}).", "",
            *([f"Every study ran the default study with `{' '.join(extra)}` changed.", ""] if extra else []), "```",
            *(shlex.join(["python", *c[1:]]) for c in commands), "```", "",
            "Intervals are 95% CIs of the confirmation phase's paired rounds, winner against the baseline "
            "(negative: the winner is faster; \"is the winner\": the baseline itself won). Race: decided, or "
            "the candidates the confirmation left undetermined against the winner and about how many more "
            "processes would decide each. Verdicts: questions "
            "the verdict phase answered (measurably faster or slower, the same program, or fails) of those it "
            "asked. Verdicts timed: the neighbours timed side by side in fresh processes, in fresh-process rounds "
            "(candidates that could not share a process: the study's log says why) or not at all; an identical "
            "program needs no timing.", ""]
    return "\n".join(head) + "\n" + table(summaries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(tiny_families()), help="comma-separated +model= names")
    parser.add_argument("--output-root", type=Path, default=Path("/tmp/autocompile-suite"))
    parser.add_argument("--results", type=Path, default=RESULTS, help="where suite.md and the record files go")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--table-only", action="store_true", help="the table from studies already run")
    parser.add_argument("extra", nargs="*", help="Hydra overrides for every study (after --)")
    args = parser.parse_args()
    families = [f for f in args.families.split(",") if f]
    commands = [command(f, args.output_root, args.extra) for f in families]
    if args.dry_run:
        print("\n".join(shlex.join(["python", *c[1:]]) for c in commands))
        return 0
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for family in families:
            run_study(family, args.output_root, args.extra, args.results)
    summaries, missing = [], []
    for family in families:
        path = args.output_root / f"suite-{family}" / "summary.json"
        if path.is_file():
            summaries.append(json.loads(path.read_text()))
        else:
            missing.append(family)
    if missing:
        print(f"no summary.json for {', '.join(missing)} under {args.output_root}: left out of the table")
    (args.results / "suite.md").write_text(document(summaries, commands, families, args.extra))
    print(f"wrote {args.results / 'suite.md'}")
    return 0 if not missing else 1


if __name__ == "__main__":
    sys.exit(main())
