"""``task=compare`` in the terminal: each candidate's step time and cold compile, and every candidate
against the first with its interval and a verdict in words."""

from __future__ import annotations

from rich.table import Table

from autocompile.config.choices import FRESH_PROCESSES, SIDE_BY_SIDE
from autocompile.report.view import console, fmt_bytes
from autocompile.study.comparison import Comparison


def print_comparison(report: Comparison) -> None:
    out = console()
    how = {SIDE_BY_SIDE: f"side by side in {report.processes} fresh processes (windows in rotating order)",
           FRESH_PROCESSES: f"in fresh-process rounds ({report.processes}), not side by side: {report.why}",
           "none": f"not compared: {report.why}"}[report.method]
    table = Table(title=f"autocompile compare: timed {how}", title_justify="left")
    for col in ("candidate", "configuration", "ms/step", "alone ms/step", "cold compile s", "peak memory"):
        table.add_column(col, justify="left" if col in ("candidate", "configuration") else "right")
    for row in report.candidates:
        if row.status != "ok":
            table.add_row(row.label, f"[red]{row.status}: {row.reason or ''}"[:160], "-", "-", "-", "-")
            continue
        table.add_row(row.label, row.name, _ms(row.step_s), _ms(row.step_s_alone), f"{row.compile_s or 0.0:.1f}",
                      fmt_bytes(row.peak_memory_bytes))
    out.print(table)
    base = report.candidates[0].label
    for p in report.pairs:
        row = report.candidates[p.b]
        ttt = p.time_to_train
        ttt_text = (f"{ttt.change:+.1%} [95% CI {ttt.low * 100:+.1f}, {ttt.high * 100:+.1f}]"
                    if ttt.low is not None and ttt.high is not None else f"{ttt.change:+.1%}")
        if " + " in ttt.basis:  # which cold-compile spread it carries, on how many df
            ttt_text += f" ({ttt.basis.rpartition(' + ')[2]})"
        if not p.alone_agrees:  # the side-by-side ratio is not the answer: no time to train from it
            ttt_text = "not stated"
        out.print(f"{row.label} vs {base}: {p.verdict}; time to train {p.horizon_steps:,} steps {ttt_text} "
                  f"({p.step.rounds} paired windows, {p.step.processes} processes, {p.step.basis}"
                  + (f"; {p.step.dropped} stalled round(s) left out" if p.step.dropped else "") + ")")
    for line in report.speed_changes:
        out.print(f"[yellow]{line}")
    for f in report.failed:
        out.print(f"[red]{f.label} not compared: {f.reason}")
    out.print(f"compare.json: {report.run_dir}/compare.json")


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f}" if seconds else "-"
