"""Rich renderings of measurements for the terminal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autocompile.trial.timeline import wall_split
from autocompile.trial.timing.result import ProgressEvent, TrialResult
from autocompile.workload.data import rate_label


def console() -> Console:
    """The terminal's width on a terminal; wide enough for the tables in logs and pipes."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=180)


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def measurement_table(result: TrialResult, name: str) -> Table:
    """One trial, every number the worker measured, with its spread."""
    table = Table(title=f"autocompile measurement: {name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("status", f"[{'green' if result.ok else 'red'}]{result.status}[/]")
    if not result.ok:
        table.add_row("failure", str(result.failure or "-"))
        table.add_row("reason", str(result.reason or "-"))
    else:
        windows = result.step_s_windows or []
        step_s, compile_s = result.step_s or 0.0, result.compile_s or 0.0
        table.add_row(f"{rate_label(result)} (median of windows)",
                      f"{result.tokens_per_s or 0.0:,.0f}  (CV {result.step_s_cv or 0.0:.1%})")
        table.add_row("step time", f"{step_s * 1e3:.2f} ms  (windows {min(windows) * 1e3:.2f} to "
                      f"{max(windows) * 1e3:.2f} ms, n={len(windows)})")
        dynamo = (result.dynamo_compile_s or {}).get("_compile.compile_inner")
        table.add_row("compile time", f"{compile_s:.2f} s  (first step {result.first_step_s or 0.0:.2f} s"
                      + (f", dynamo's own total {dynamo:.2f} s" if dynamo is not None else "") + ")")
        table.add_row("compiled", ", ".join(result.compiled or []) or "nothing (eager)")
        if result.compiled:
            table.add_row("weights inside compiled graphs", f"{result.compiled_coverage or 0.0:.1%}")
        table.add_row("program fingerprint", str(result.fingerprint or "-"))
        if result.sharded:
            table.add_row("fully_shard (FSDP2 hooks run eager)", ", ".join(result.sharded))
        table.add_row("graphs / breaks / recompiles in timed part",
                      f"{result.graph_count} / {result.graph_breaks} / {result.recompiles_timed}"
                      + (f" (timed again after {result.rewarm_steps} steps of late compiles)"
                         if result.rewarm_steps else ""))
        for reason, count in (result.graph_break_reasons or {}).items():
            table.add_row(f"  graph break x{count}", reason)
        for hit in (result.script or {}).get("recompile_limit_hits") or []:  # later calls of it ran eager
            table.add_row("  recompile limit (calls past it run eager)", hit)
        if shapes := (result.script or {}).get("input_shapes"):  # what the timing covered, not what comes later
            table.add_row("input shapes (training forwards)", "; ".join(
                f"{part} " + ", ".join(f"{shape} x{n}" for shape, n in seen.items())
                for part, seen in shapes.items() if seen))
        table.add_row("peak memory", fmt_bytes(result.peak_memory_bytes))
        table.add_row("MFU", f"{result.mfu:.1%}" if result.mfu is not None else "- (no known peak)")
        losses = result.losses or []
        if losses:
            table.add_row("loss first / last", f"{losses[0]:.4f} / {losses[-1]:.4f}  ({len(losses)} steps)")
    split = wall_split(result)
    if split:
        paused = (result.lease or {}).get("paused_s", 0.0)
        table.add_row("wall time", f"{result.wall_s:.1f} s = " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f}" for k, v in split.items() if v or k != "waited_s")
            + (f" (paused {paused:.1f} s of it while other processes timed)" if paused else ""))
    elif result.wall_s is not None:
        table.add_row("wall time", f"{result.wall_s:.1f} s")
    env = result.environment or {}
    if env:
        table.add_row("environment", f"torch {env.get('torch')}, {env.get('device_name')}, world size "
                      f"{env.get('world_size')}, {env.get('threads')} threads")
    table.add_row("trial directory", str(result.trial_dir or "-"))
    return table


def progress_text(events: list[ProgressEvent], elapsed: float) -> str:
    """Where a running trial is, from its worker's progress events: starting, compiling, timing window k."""
    total = next((e.get("steps") for e in events if e["event"] == "warmup_start"), None)
    last = events[-1] if events else {"event": ""}
    kind = last["event"]
    if kind == "started":
        what = "building the model"
    elif kind == "warmup_start":
        what = f"warm-up (compile): step 1/{total}"
    elif kind == "warmup_step":
        done = last["step"] + 1
        what = (f"warm-up (compile): step {done + 1}/{total} (step {done}: {last['seconds']:.1f} s)"
                if total is None or done < total else "checking what it compiled")
    elif kind in ("compiled", "lease_granted"):
        what = "timing: window 1"
    elif kind == "lease_wait":
        what = "compiled; waiting for its turn on the device (another process times)"
    elif kind == "window":
        what = f"timing: window {last['window'] + 2} (window {last['window'] + 1}: {last['step_s'] * 1e3:.1f} ms/step)"
    elif kind == "rewarm":
        what = "late compiles in the timed part: timing again"
    else:
        what = "starting: process, imports"
    return f"{what}, {elapsed:.0f} s"


class StudyView:
    """Live terminal view of a study: recent trials, what each running one is doing, overall progress
    and the time left."""

    def __init__(self, n_trials: int, objective: Any, remaining: Any = None, rows: int = 15,
                 show_table: bool = True) -> None:
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.objective = objective
        self.rows = rows
        self.remaining = remaining  # estimate.Remaining (or None): the "~N min left" beside the bar
        self.show_table = show_table  # False after the search: its table is on the screen already
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.description}"))
        self.task = self.progress.add_task("", total=n_trials)
        self.trials: list[Any] = []
        self.watching: dict[int | str, tuple[str, Path | None, float]] = {}
        # Rendered again at every refresh: the running trials' progress files are read as they grow.
        self.live = Live(console=console(), refresh_per_second=2, transient=False, get_renderable=self.render)

    def __enter__(self) -> StudyView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)
        if not self.live.console.is_terminal:
            self.live.console.print()  # in a log the last frame ends its line: what follows starts a new one

    def running(self, number: int | str, name: str, trial_dir: Path | None = None) -> None:
        """Trial ``number`` (or ``reference``) runs; with its directory, its progress events are shown."""
        self.watching[number] = (name, trial_dir, time.time())
        self.live.refresh()

    def finished(self, number: int | str) -> None:
        self.watching.pop(number, None)
        self.live.refresh()

    def running_lines(self) -> list[str]:
        from autocompile.trial.launcher import read_progress
        from autocompile.trial.lease import MACHINE

        lines = []
        for number, (name, trial_dir, since) in list(self.watching.items()):
            label = f"trial {number}" if isinstance(number, int) else str(number)
            doing = progress_text(read_progress(trial_dir), time.time() - since) if trial_dir else "waiting"
            if trial_dir and MACHINE.paused(trial_dir):
                doing = f"paused while another process times; {doing}"
            lines.append(f"[bold]{label}[/] {escape(name)}: {escape(doing)}")
        return lines

    def refresh(self, trials: list[Any]) -> None:
        from autocompile.study.records.optuna_store import counted

        self.trials = trials
        self.progress.update(self.task, completed=sum(counted(t) for t in trials))
        if self.remaining is not None:
            self.remaining.update()
        self.live.refresh()

    def render(self) -> Any:
        from rich.console import Group

        from autocompile.study.records.optuna_store import counted
        from autocompile.study.records.record import TrialRecord

        table = Table(title="autocompile study", title_justify="left", expand=False)
        records = [TrialRecord.of(t) for t in self.trials]
        rate = rate_label(record.result for record in records)
        for col in ("#", "configuration (vs defaults)", "state", rate, "compile s", "objective", "best"):
            table.add_column(col, overflow="fold")
        best_score = None
        lines = []
        for t, record in zip(self.trials, records, strict=True):
            result = record.measured
            state = t.state.name.lower()
            if record.duplicate_of is not None:
                state = f"= #{record.duplicate_of}"
            elif record.interrupted:
                state = "interrupted"
            ok = result.ok
            score = self.objective.score(result) if ok else None
            marker = ""
            if score is not None and t.state.name == "COMPLETE" and (best_score is None or score < best_score):
                best_score, marker = score, "*"
            if not counted(t) and t.state.name != "RUNNING":
                continue
            lines.append((str(t.number), record.name, state, f"{result.tokens_per_s:,.0f}" if ok else "-",
                          f"{result.compile_s:.1f}" if ok else "-",
                          "/".join(f"{v:,.1f}" for v in t.values) if t.values else (record.reason or "")[:60], marker))
        for row in lines[-self.rows:]:
            table.add_row(*row)
        if self.remaining is not None:
            self.progress.update(self.task, description=self.remaining.text())
        return Group(*([table] if lines and self.show_table else []), *self.running_lines(), self.progress)
