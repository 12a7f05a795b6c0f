"""Pictures and tables of a finished study, for people: the study's MLflow parent run carries them.

Tables (CSV for tools, Markdown for the MLflow artifact viewer): every trial with its outcome, and
the verdict per knob. Plots (PNG via matplotlib, and one self-contained interactive HTML via
plotly): the Pareto front of throughput vs compile time, the per-knob effects with their
uncertainty, and the optimization history. And the parent run's note: the study in a few lines
of Markdown. Everything is computed from the study's own record
(the trials' user attributes) and the :class:`~autocompile.report.summary.Report`, never re-measured.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autocompile.report.findings.search_effects import speedup_half
from autocompile.study.records.objective import time_to_train
from autocompile.study.records.record import TrialRecord
from autocompile.study.statistics.effect import Effect
from autocompile.workload.data import rate_label

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

TRIAL_COLUMNS = ("trial", "name", "state", "baseline", "tokens_per_s", "step_ms", "step_cv", "compile_s",
                 "time_to_train_s", "objective", "peak_memory_mb", "graph_breaks", "recompiles", "duplicate_of",
                 "reason")
OBJECTIVE_LABELS = {"time_to_train": "time to train (s)", "throughput": "tokens/s", "pareto": "tokens/s"}
VERDICT_COLUMNS = ("question", "knob", "value", "reference", "step_change", "uncertainty", "compile_change_s",
                   "pairs", "matched", "measurable", "verdict")
STATE_COLOURS = {"COMPLETE": "#1f77b4", "PRUNED": "#ff7f0e", "FAIL": "#d62728"}


class TrialRowBase(TypedDict):
    trial: int
    name: str
    state: str
    """Optuna's: ``COMPLETE``, ``PRUNED`` or ``FAIL``."""
    baseline: str
    tokens_per_s: float | None
    """This and the other numbers: None unless the trial completed with a measurement."""
    throughput_unit: str
    step_ms: float | None
    step_cv: float | None
    compile_s: float | None
    time_to_train_s: float | None
    objective: float | None
    peak_memory_mb: float | None
    graph_breaks: int | None
    recompiles: int | None
    duplicate_of: int | None
    reason: str


class TrialRow(TrialRowBase, total=False):
    """One finished trial in ``trials.csv/.md`` and the plots (:func:`trial_rows`)."""

    run_id: str
    """Its MLflow child run, set by the tracker before it writes the tables."""


class VerdictRow(TypedDict):
    """One verdict in ``knob_verdicts.csv/.md``: an :class:`Effect`'s columns (:data:`VERDICT_COLUMNS`)."""

    question: str
    knob: str
    value: Any
    reference: Any
    step_change: float
    uncertainty: float
    compile_change_s: float
    pairs: int
    matched: bool
    measurable: bool
    verdict: str


def trial_rows(trials: Sequence[FrozenTrial], horizon_steps: int) -> list[TrialRow]:
    """One flat row per finished trial, in trial order."""
    rows: list[TrialRow] = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
            continue
        record = TrialRecord.of(t)
        r = record.measured
        ok = t.state == TrialState.COMPLETE and r.ok
        # A repeat timed after a warm cache: its configuration's cold compile, like every other row.
        compile_s = record.cold_compile_s
        rows.append({
            "trial": t.number, "name": record.name, "state": t.state.name,
            "baseline": record.baseline or "",
            "tokens_per_s": r.tokens_per_s if ok else None,
            "throughput_unit": r.unit,
            "step_ms": r.step_s * 1e3 if ok else None,
            "step_cv": r.step_s_cv if ok else None,
            "compile_s": compile_s if ok else None,
            "time_to_train_s": time_to_train(compile_s, r.step_s, horizon_steps) if ok else None,
            "objective": t.values[0] if t.values else None,
            "peak_memory_mb": r.peak_memory_bytes / 2**20 if ok and r.peak_memory_bytes else None,
            "graph_breaks": r.graph_breaks if ok else None,
            "recompiles": r.recompiles_timed if ok else None,
            "duplicate_of": record.duplicate_of,
            "reason": record.reason or r.reason or "",
        })
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def verdict_row(e: Effect) -> VerdictRow:
    return {"question": e.question, "knob": e.knob, "value": e.value, "reference": e.reference,
            "step_change": e.step_change, "uncertainty": e.uncertainty, "compile_change_s": e.compile_change_s,
            "pairs": e.pairs, "matched": e.matched, "measurable": e.measurable, "verdict": e.verdict}


def _markdown(columns: Sequence[str], rows: Sequence[TrialRow] | Sequence[VerdictRow], title: str) -> str:
    def esc(value: Any) -> str:
        return _cell(value).replace("|", "\\|").replace("\n", " ")

    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(esc(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _csv(path: Path, columns: Sequence[str], rows: Sequence[TrialRow] | Sequence[VerdictRow]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({c: row.get(c) for c in columns} for row in rows)


def write_tables(rows: Sequence[TrialRow], effects: Sequence[Effect], out_dir: Path) -> list[Path]:
    """``trials.csv/.md`` (every trial, failures with their reason) and ``knob_verdicts.csv/.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts = [verdict_row(e) for e in effects]
    _csv(out_dir / "trials.csv", (*TRIAL_COLUMNS, "run_id"), rows)
    _csv(out_dir / "knob_verdicts.csv", VERDICT_COLUMNS, verdicts)
    (out_dir / "trials.md").write_text(_markdown(TRIAL_COLUMNS, rows, "Trials"))
    (out_dir / "knob_verdicts.md").write_text(
        _markdown(("question", "knob", "verdict"), verdicts, "Verdict per knob (value vs reference)")
        if verdicts else "# Verdict per knob\n\nNo knob took two values across complete trials.\n")
    return [out_dir / n for n in ("trials.csv", "trials.md", "knob_verdicts.csv", "knob_verdicts.md")]


NOTE_MAX = 8000
"""The longest tag value MLflow keeps (``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``): a longer note is cut."""


def study_note(report: Any) -> str:
    """The study's description on its MLflow parent run (Markdown): counts, best, speedups, verdicts."""
    c = report.counts
    lines = [f"**autocompile study `{report.study_name}`** ({report.model}, objective {report.objective}): "
             f"{c['trials']} trials, {c['complete']} complete, {c['pruned']} pruned, {c['failed']} failed "
             f"({report.stop_reason})."]
    best = report.best
    if best is None:
        groups = getattr(report, "failures", None) or []
        lines.append("No feasible result." + ("".join(f"\n- {len(g.trials)} x {g.outcome}: {g.reason}"
                                                   for g in groups) if groups else " Nothing was measured.")
                     + "\n\nEach trial's reason is in its child run and in `tables/trials.md`.")
    else:
        r = best.result
        lines.append(f"**Best: trial {best.number}** `{best.name}`: {r.tokens_per_s:,.0f} {r.unit}/s, "
                     f"compile {r.compile_s:.1f} s, time to train {report.horizon_steps} steps "
                     f"{best.time_to_train_s:.1f} s.")
        lines.append("\n".join(
            f"- vs {name}: steps {s['step_speedup']:.2f}x "
            + speedup_half(s)
            + f", time to train {s['time_to_train_speedup']:.2f}x" for name, s in report.speedups.items()))
    outcome = report.confirmed
    if outcome is not None and (w := outcome.winner) is not None:
        lines.append(f"**Confirmed** ({outcome.rounds} interleaved rounds): {outcome.conclusion}. Recommended: "
                     f"trial {w.trial} `{w.name or 'defaults'}`."
                     + "".join(f"\n- step time vs {n}: {g.text}" for n, g in outcome.gains.items()))
    tail = ("Artifacts: `plots/` (Pareto front, knob effects, history; `plots.html` is interactive), "
            "`tables/`, `best_config.py`, `config.yaml`. Compare the trials: select the child runs, then Compare.")
    for cut in (False, True):  # whole verdicts, else each one's first clause: a tag holds NOTE_MAX characters
        table = ["| knob | verdict |\n|---|---|\n" + "\n".join(
            f"| {e.knob} | {(e.verdict.split(';')[0] if cut else e.verdict).replace('|', '/')} |"
            for e in report.effects)] if report.effects else []
        note = "\n\n".join([*lines, *table, tail + (" Each verdict in full: `tables/`." if cut else "")])
        if len(note) <= NOTE_MAX:
            return note
    return note[:NOTE_MAX - 40] + "\n\n(cut to fit; in full: `tables/`)"


def _best_so_far(rows: Sequence[TrialRow], maximize: bool) -> list[tuple[int, float]]:
    best: float | None = None
    out = []
    for row in rows:
        v = row["objective"]
        if row["state"] == "COMPLETE" and v is not None and math.isfinite(v):
            best = v if best is None else (max(best, v) if maximize else min(best, v))
        if best is not None:
            out.append((row["trial"], best))
    return out


def measured(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """Complete trials with a measurement of their own (a dedupe copy would sit on its original)."""
    return [r for r in rows if r["tokens_per_s"] is not None and r["duplicate_of"] is None]


def _effect_label(e: Effect) -> str:
    return f"{e.knob}: {e.value} vs {e.reference}"


def _effect_colour(e: Effect) -> str:
    if not e.measurable:
        return "#9e9e9e"
    return "#2ca02c" if e.step_change < 0 else "#d62728"


def matplotlib_figures(rows: Sequence[TrialRow], pareto: Sequence[int], effects: Sequence[Effect],
                       objective: str, maximize: bool) -> dict[str, Figure]:
    """Three static figures: ``pareto``, ``knob_effects``, ``history`` (matplotlib, no pyplot state)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    complete = measured(rows)
    figs: dict[str, Figure] = {}

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    front = sorted((r for r in complete if r["trial"] in pareto), key=lambda r: r["compile_s"])
    ax.scatter([r["compile_s"] for r in complete], [r["tokens_per_s"] for r in complete], c="#9ecae1",
               edgecolors="#1f77b4", s=40, label="complete trial", zorder=2)
    if front:
        ax.step([r["compile_s"] for r in front], [r["tokens_per_s"] for r in front], where="post", c="#2ca02c",
                lw=1.5, zorder=1)
        ax.scatter([r["compile_s"] for r in front], [r["tokens_per_s"] for r in front], c="#2ca02c", s=70,
                   label="Pareto front", zorder=3)
    for r in complete:
        label = f"#{r['trial']}" + (f" {r['baseline']}" if r["baseline"] else "")
        ax.annotate(label, (r["compile_s"], r["tokens_per_s"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.set(xlabel="compile time (s)", ylabel=f"{rate_label(complete)} (steady state)",
           title="Throughput vs compile time (up and left is better)")
    ax.grid(alpha=0.3)
    if complete:
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no complete trial", ha="center", transform=ax.transAxes)
    figs["pareto"] = fig

    fig = Figure(figsize=(10, 1.6 + 0.45 * max(len(effects), 1)), layout="constrained")
    ax_step, ax_compile = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    if effects:
        ys = list(range(len(effects)))[::-1]
        ax_step.barh(ys, [e.step_change * 100 for e in effects], xerr=[e.uncertainty * 100 for e in effects],
                     color=[_effect_colour(e) for e in effects], capsize=3)
        ax_step.set_yticks(ys, [_effect_label(e) for e in effects], fontsize=8)
        ax_compile.barh(ys, [e.compile_change_s for e in effects], color="#8c6d31")
    else:
        ax_step.text(0.5, 0.5, "no knob took two values across complete trials", ha="center",
                     transform=ax_step.transAxes)
    ax_step.axvline(0, c="k", lw=0.8)
    ax_compile.axvline(0, c="k", lw=0.8)
    ax_step.set(xlabel="step time change, % (negative = faster; grey = not measurable)", title="Per-knob effect")
    ax_compile.set(xlabel="compile time change (s)", title="Compile cost")
    figs["knob_effects"] = fig

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    done = [r for r in rows if r["state"] == "COMPLETE" and r["objective"] is not None]
    if done:
        ax.scatter([r["trial"] for r in done], [r["objective"] for r in done], c=STATE_COLOURS["COMPLETE"],
                   label="complete", zorder=3)
    best = _best_so_far(rows, maximize)
    if best:
        ax.step([b[0] for b in best], [b[1] for b in best], where="post", c="#2ca02c", label="best so far")
    floor = min((r["objective"] for r in done), default=0.0)
    for state, marker in (("PRUNED", "v"), ("FAIL", "x")):
        xs = [r["trial"] for r in rows if r["state"] == state]
        if xs:
            ax.scatter(xs, [floor] * len(xs), c=STATE_COLOURS[state], marker=marker, s=60, zorder=3,
                       label=f"{state.lower()} (no value)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="trial", ylabel=objective, title=f"Optimization history ({'max' if maximize else 'min'}imize)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figs["history"] = fig
    return figs


def plotly_figures(rows: Sequence[TrialRow], pareto: Sequence[int], effects: Sequence[Effect],
                   objective: str, maximize: bool) -> dict[str, go.Figure]:
    """The same three figures, interactive: hover shows each trial's name, numbers and reason."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    def hover(r: TrialRow) -> str:
        parts = [f"<b>#{r['trial']}</b> {r['name']}", f"state: {r['state']}"]
        parts += [f"{k}: {_cell(r[k])}" for k in ("tokens_per_s", "step_ms", "compile_s", "objective")
                  if r[k] is not None]
        if r["reason"]:
            parts.append("reason: " + r["reason"][:200])
        return "<br>".join(parts)

    complete = measured(rows)
    front = sorted((r for r in complete if r["trial"] in pareto), key=lambda r: r["compile_s"])
    pf = go.Figure()
    pf.add_scatter(x=[r["compile_s"] for r in complete], y=[r["tokens_per_s"] for r in complete], mode="markers+text",
                   text=[f"#{r['trial']} {r['baseline']}".strip() for r in complete], textposition="top right",
                   hovertext=[hover(r) for r in complete], hoverinfo="text", name="complete trial")
    pf.add_scatter(x=[r["compile_s"] for r in front], y=[r["tokens_per_s"] for r in front], mode="lines+markers",
                   line_shape="hv", marker_size=11, hovertext=[hover(r) for r in front], hoverinfo="text",
                   name="Pareto front")
    pf.update_layout(title="Throughput vs compile time (up and left is better)", xaxis_title="compile time (s)",
                     yaxis_title=f"{rate_label(complete)} (steady state)")

    ef = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.6, 0.4],
                       subplot_titles=("step time change, % (negative = faster)", "compile time change (s)"))
    labels = [_effect_label(e) for e in effects]
    ef.add_bar(y=labels, x=[e.step_change * 100 for e in effects], orientation="h",
               error_x={"type": "data", "array": [e.uncertainty * 100 for e in effects]},
               marker_color=[_effect_colour(e) for e in effects], hovertext=[e.verdict for e in effects],
               hoverinfo="text", name="step time", row=1, col=1)
    ef.add_bar(y=labels, x=[e.compile_change_s for e in effects], orientation="h", marker_color="#8c6d31",
               name="compile", row=1, col=2)
    ef.update_layout(title="Per-knob effect (grey = no measurable effect)", showlegend=False,
                     height=250 + 30 * len(effects), yaxis_autorange="reversed")

    hf = go.Figure()
    for state in ("COMPLETE", "PRUNED", "FAIL"):
        sel = [r for r in rows if r["state"] == state]
        if not sel:
            continue
        floor = min((r["objective"] for r in rows if r["objective"] is not None), default=0.0)
        hf.add_scatter(x=[r["trial"] for r in sel], y=[r["objective"] if r["objective"] is not None else floor
                                                       for r in sel],
                       mode="markers", marker={"color": STATE_COLOURS[state], "size": 10,
                                               "symbol": {"COMPLETE": "circle", "PRUNED": "triangle-down",
                                                          "FAIL": "x"}[state]},
                       hovertext=[hover(r) for r in sel], hoverinfo="text", name=state.lower())
    best = _best_so_far(rows, maximize)
    hf.add_scatter(x=[b[0] for b in best], y=[b[1] for b in best], mode="lines", line_shape="hv",
                   name="best so far")
    hf.update_layout(title=f"Optimization history ({'max' if maximize else 'min'}imize {objective})",
                     xaxis_title="trial", yaxis_title=objective)
    return {"pareto": pf, "knob_effects": ef, "history": hf}


def write_plots(rows: Sequence[TrialRow], pareto: Sequence[int], effects: Sequence[Effect],
                directions: Sequence[StudyDirection], objective: str, out_dir: Path) -> list[Path]:
    """PNG per figure and one ``plots.html`` holding all three, interactive and self-contained (works offline)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    maximize = bool(directions) and directions[0] == StudyDirection.MAXIMIZE
    objective = OBJECTIVE_LABELS.get(objective, objective).replace("tokens/s", rate_label(measured(rows)))
    written = []
    for name, fig in matplotlib_figures(rows, pareto, effects, objective, maximize).items():
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        written.append(out_dir / f"{name}.png")
    figs = plotly_figures(rows, pareto, effects, objective, maximize)
    # plotly.js (~4 MB) once, inline: the MLflow artifact viewer and offline machines need no CDN.
    parts = [fig.to_html(full_html=False, include_plotlyjs=i == 0) for i, fig in enumerate(figs.values())]
    html = out_dir / "plots.html"
    html.write_text("<!doctype html><html><head><meta charset='utf-8'><title>autocompile study</title></head>"
                    "<body>" + "\n".join(parts) + "</body></html>")
    written.append(html)
    return written
