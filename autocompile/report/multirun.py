"""A Hydra multirun's summary: one row per study (``python -m autocompile -m ...``), from each job's summary.json."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from autocompile.report.view import console as make_console
from autocompile.study.records.record import Measurement


def print_multirun_summary(sweep_dir: Path) -> None:
    """One row per study of a Hydra multirun, from each job's summary.json."""
    table = Table(title=f"autocompile multirun: {sweep_dir}", title_justify="left")
    for col in ("study", "best configuration", "throughput", "compile s", "vs eager", "trials"):
        table.add_column(col)
    for path in sorted(sweep_dir.glob("*/summary.json")):
        s = json.loads(path.read_text())
        best = s.get("best")
        r = Measurement.from_dict(best["result"]) if best else None
        eager = s.get("speedups", {}).get("eager")
        table.add_row(s["study"], best["name"] if best else "-",
                      f"{r.tokens_per_s:,.0f} {r.unit}/s" if r else "-", f"{r.compile_s:.1f}" if r else "-",
                      f"{eager['step_speedup']:.2f}x" if eager else "-", str(s["counts"]["trials"]))
    make_console().print(table)
