"""Issue 50: the committed side-by-side records read again under the new rules (a decision needs 3 processes; the
compile spread pooled with the device class's prior), beside what they printed. Only records that kept their
per-process data can be read again: the default studies of issue 35 (``cpu-2core/issue35_phases/``, 7 processes'
windows, compile seconds from the record's trial table) and the H200 study (``h200/summary.json``, 2 processes'
step times). Every other committed side-by-side record ran 4-7 processes (``grep -rhoE "side by side in [0-9]+"``),
where the step-time rule is unchanged; only its time-to-train intervals carry the new compile spread.

    python benchmarks/recipes/reanalyse_records.py > benchmarks/results/cpu-2core/issue50/reanalysis.md
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from autocompile.config.compare_settings import MIN_PROCESSES
from autocompile.config.sections import ObjectiveSettings
from autocompile.study.phases.confirmation import Candidate, versus, what_decides
from autocompile.study.phases.racing import simplicity
from autocompile.study.records.compile_prior import class_prior
from autocompile.study.records.objective import Objective
from autocompile.study.statistics.decisions import classify, race
from autocompile.study.statistics.intervals import CompileSpread, Ratio, pooled_spread

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
ROW = re.compile(r"^│ (\d+)\s+│ (.+?)\s+│ (\w+)\s+│ [\d,-]+\s+│ ([\d.]+|-)\s+│")
SPREAD = re.compile(r"Cold compile spread in time-to-train intervals: ([\d.]+)% \((measured: .*?, (\d+) df|prior)")
CPU_RECORDS = {"before": "cpu-2core/issue35_default_study_before_4a75231.txt",
               "after": "cpu-2core/issue35_default_study_after_570666d.txt"}


def trial_table(text: str) -> dict[int, tuple[str, float]]:
    """Trial number -> (configuration, cold compile seconds) from a record's trial table."""
    found = {}
    for line in text.splitlines():
        if (m := ROW.match(line)) and m.group(4) != "-":
            found[int(m.group(1))] = (m.group(2), float(m.group(4)))
    return found


def old_spread(text: str) -> CompileSpread:
    m = SPREAD.search(text)
    assert m, "no compile spread line"
    if m.group(2) == "prior":
        return CompileSpread(0.06, 4, "prior 6.0% on 4 df (before issue 50)")
    return CompileSpread(float(m.group(1)) / 100, int(m.group(3)), f"measured {m.group(1)}% on {m.group(3)} df alone")


def new_spread(old: CompileSpread, device: str) -> CompileSpread:
    prior = class_prior(device, ObjectiveSettings())
    measured = None if old.source.startswith("prior") else (old.cv, old.df)
    return pooled_spread(prior, *(measured or (None, 0)))


def text(r: Ratio | None) -> str:
    return "-" if r is None or r.low is None else f"{r.change:+.1%} [{r.low * 100:+.1f}, {r.high * 100:+.1f}]"


def read_race(name: str, candidates: list[Candidate], old: CompileSpread, new: CompileSpread, processes: int) -> None:
    objective = Objective(ObjectiveSettings())
    means = [math.fsum(math.log(s) for s in c.scores(objective).values()) / len(c.steps) for c in candidates]
    simple = [simplicity(c.config) for c in candidates]
    print(f"\n### {name}\n\nCompile spread before: {old.cv:.1%} on {old.df:g} df ({old.source}); after: {new.cv:.1%} "
          f"on {new.df:g} df.\n")
    print("| candidate | time to train vs leader, before | status | after | status | what would decide it |")
    print("|---|---|---|---|---|---|")
    for spread, store in ((old, "before"), (new, "after")):
        decision = race(means, simple, lambda i, j, s=spread: versus(candidates[i], candidates[j], objective, True, s),
                        objective.settings.tie_margin)
        for c, status in zip(candidates, decision.status, strict=True):
            r = None if status == "leader" else versus(c, candidates[decision.leader], objective, True, spread)
            if store == "after" and processes < MIN_PROCESSES and status not in ("leader",):
                status = f"{classify(r, objective.settings.tie_margin)}: direction only ({processes} processes)"
            setattr(c, store, (r, status))
    for c in candidates:
        (rb, sb), (ra, sa) = c.before, c.after  # type: ignore[attr-defined]
        decide = what_decides(ra, objective.settings.tie_margin)[1] if sa.startswith("undetermined") else ""
        print(f"| {c.name} | {text(rb)} | {sb} | {text(ra)} | {sa} | {decide} |")


def cpu(which: str) -> None:
    record = (RESULTS / CPU_RECORDS[which]).read_text()
    table = trial_table(record)
    per: dict[str, Candidate] = {}
    phases = RESULTS / "cpu-2core" / "issue35_phases" / which / "phases"
    for p, path in enumerate(sorted(phases.glob("confirm-round*/result.json"))):
        for c in json.loads(path.read_text())["candidates"]:
            number = int(c["label"].lstrip("#"))
            config, compile_s = table[number]
            cand = per.setdefault(c["label"], Candidate(c["label"], number, config, {"compile.scope": (
                config.split("compile.scope=")[1].split(",")[0] if "compile.scope=" in config else "module")},
                None, compile_s))
            windows = c["step_s_windows"]
            cand.windows[p] = windows
            cand.steps[p] = c["step_s"]  # the step time the study's race read (the process's clean windows)
            if c.get("step_cpu_s_windows"):
                cand.cpu[p] = c["step_cpu_s_windows"]
    old = old_spread(record)
    read_race(f"{CPU_RECORDS[which]} (7 processes)", list(per.values()), old, new_spread(old, "cpu"), 7)


def h200() -> None:
    summary = json.loads((RESULTS / "h200" / "summary.json").read_text())
    confirmed = summary["confirmed"]
    candidates = []
    for row in confirmed["candidates"]:
        steps = {int(r): s for r, s in row["step_s_rounds"].items()}
        c = Candidate(row["label"], row["trial"], row["name"], row["config"], row["baseline"], row["compile_s_cold"],
                      steps, {r: [s] for r, s in steps.items()})
        candidates.append(c)
    old = CompileSpread(confirmed["compile_spread"]["cv"], confirmed["compile_spread"]["df"], "prior 6.0% on 4 df")
    read_race("h200/summary.json (2 processes; each process's step time, its windows not kept)", candidates, old,
              new_spread(old, "cuda"), 2)


def main() -> None:
    print("# The committed side-by-side records under issue 50's rules\n\nCommand: `python "
          "benchmarks/recipes/reanalyse_records.py`. Before: the rules that printed the record (a compile spread "
          "measured on any df replaced the 6 % prior; 2 processes decided). After: the compile spread pooled with "
          "the device class's prior by df; below 3 processes no decision, only a direction.")
    cpu("before")
    cpu("after")
    h200()


if __name__ == "__main__":
    main()
