"""The study's report on the terminal: what happened to every trial, the best and its speedups over the baselines,
the confirmation's race, the Pareto front, the verdicts, the phases' walls against their estimate, and the commands
to apply, measure again and look further (built by :func:`autocompile.report.summary.build_report`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autocompile.report.findings.entry import Entry
from autocompile.report.findings.search_effects import SearchNoise, speedup_half
from autocompile.report.race_table import print_confirmed
from autocompile.report.summary import Report, expected_line
from autocompile.report.view import console as make_console
from autocompile.study.statistics.effect import Effect
from autocompile.study.statistics.noise import Noise
from autocompile.trial.timing.compile_artifacts import warm_line
from autocompile.workload.data import rate_label


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or make_console()
    console.rule(f"[bold]autocompile: {report.study_name}")
    console.print(counts_line(report))
    best = report.best
    if best is None:
        for line in no_result_lines(report):
            console.print(line)
        return
    r = best.result
    brief = (r.windows or 0) < 2  # a re-verification's brief runs: the confirmation below decides
    console.print(f"\n[bold green]Best[/] (trial {best.number}{', one window: the race below decides' * brief}): "
                  f"{best.name}")
    spread = "one window" if brief else f"CV {r.step_s_cv:.1%}"
    console.print(f"  {r.tokens_per_s:,.0f} {r.unit}/s, {r.step_s * 1e3:.2f} ms/step ({spread}), "
                  f"compile {r.compile_s:.1f} s, time to train {report.horizon_steps} steps "
                  f"{best.time_to_train_s:.1f} s")
    for name, s in report.speedups.items():
        console.print(f"  vs {name:<10}: steps {s['step_speedup']:.2f}x {speedup_half(s)}, "  # as_written: 10
                      f"time to train {s['time_to_train_speedup']:.2f}x (search: one fresh process each)")
    console.print(noise_line(report.noise, report.search_noise))
    print_confirmed(console, report.confirmed)
    if report.recommendation_changed and report.recommended is not None:
        console.print(f"[bold yellow]Recommendation[/] (trial {report.recommended.number}, "
                      f"{report.recommended.name}): {report.recommendation_changed}")
    console.print(pareto_table(report.pareto))
    if report.effects:
        console.print(effects_table(report.effects))
    else:
        console.print("Verdict per knob: none from the search (no two complete trials that differ in one knob "
                      "only, each timed in more than one window).")
    if report.phases_wall_s:
        console.print("Wall time per phase: " + ", ".join(f"{k} {v:.0f} s" for k, v in report.phases_wall_s.items()))
    if line := expected_line(report.phases_expected_s, report.phases_wall_s, report.wall_s):
        console.print(line)
    if report.warm_start is None and report.warm_unmeasured:
        console.print(f"Warm start: not measured ({report.warm_unmeasured}).")
    elif report.warm_start is not None or report.recommended is not None:
        console.print(warm_line(report.warm_start))
    console.print(f"\nApply it: {report.run_dir}/best_config.py (code) and best_config.yaml")
    console.print(f"Measure it again: {report.measure_command}")
    for what, command in report.commands.items():
        console.print(f"{what}: {command}")
    if report.stop_reason == "interrupted":
        console.print("[yellow]Interrupted: the results above are partial; rerun the same command to resume.")


def counts_line(report: Report) -> str:
    """What happened to every trial of the search: measured (and how it ended), copied, stopped, never started."""
    c = report.counts
    parts = [f"{c['trials']} trials in {report.wall_s:.0f} s ({report.stop_reason}): {c['measured']} measured "
             f"({c['complete']} complete, {c['pruned']} pruned, {c['failed']} failed, {c['infeasible']} of the "
             f"complete infeasible)"]
    if c["duplicates_skipped"]:
        parts.append(f"{c['duplicates_skipped']} duplicates not measured again ({c['same_program']} of them "
                     "stopped after compiling a program already measured)")
    if c.get("remeasured"):
        parts.append(f"{c['remeasured']} near-miss prune(s) measured once more ({c['recovered']} completed: a "
                     "prune is one noisy window)")
    if c["interrupted"]:
        parts.append(f"{c['interrupted']} interrupted (measured nothing, queued again)")
    if c.get("queued"):
        parts.append(f"{c['queued']} queued and never started")
    if c["confirm_repeats"] or c["verdict_repeats"]:
        parts.append(f"then {c['confirm_repeats']} confirmation and {c['verdict_repeats']} verdict repeats")
    return "; ".join(parts)


def no_result_lines(report: Report) -> list[str]:
    """The closing message of a study without a feasible result: why, in the terms of what happened."""
    c = report.counts
    if not c["measured"]:
        if report.stop_reason == "interrupted":
            return ["[yellow]Interrupted before any trial finished: nothing measured yet; rerun the same command "
                    f"to resume ({c.get('queued', 0)} configuration(s) queued for it).",
                    f"  {report.run_dir}"]
        return [f"[red]Nothing measured ({report.stop_reason}): no trial finished a measurement."]
    lines = [f"[red]No feasible result: nothing to recommend. What ended the {c['measured']} measured trial(s):"]
    for group in report.failures:
        numbers = ", ".join(map(str, group.trials[:8])) + (" ..." if len(group.trials) > 8 else "")
        lines.append(f"  {len(group.trials)} x {group.outcome}: {group.reason or '(no reason recorded)'} "
                     f"(trial {numbers})")
    lines.append(f"  Each trial's logs: {report.run_dir}/trials/NNNN/ (stderr.log, result.json)")
    if report.stop_reason == "interrupted":
        lines.append("Interrupted: rerun the same command to resume the study.")
    return lines


def noise_line(noise: Noise | None, assumed: SearchNoise | None = None) -> str:
    if not noise:
        used = f"assumes {assumed.source}" if assumed else "assumes the rules' prior"
        return ("Run-to-run noise: not measured (no configuration ran alone in two fresh processes); each ± of the "
                f"search below (a 95% half-width) {used}, as the study's rules do.")
    return (f"Run-to-run noise of step time, alone: {noise.rel_sd:.1%} (relative sd across fresh processes, "
            f"{noise.df} degrees of freedom: {noise.source}); the search's ± (95% half-widths) use it.")


def pareto_table(front: list[Entry]) -> Table:
    table = Table(title="Pareto front: throughput vs compile time", title_justify="left")
    for col in ("trial", "configuration", rate_label([e.result for e in front]), "compile s", "time to train s"):
        table.add_column(col, justify="right" if col not in ("configuration",) else "left")
    for e in front:
        table.add_row(str(e.number), e.name, f"{e.result.tokens_per_s:,.0f}", f"{e.result.compile_s:.1f}",
                      f"{e.time_to_train_s:.1f}")
    return table


def effects_table(effects: list[Effect]) -> Table:
    phase_run = any(e.basis == "verdict" for e in effects)
    levels = "/".join(f"{x:.0%}" for x in sorted({e.level for e in effects if e.basis == "verdict"}, reverse=True))
    title = (f"Verdict per question: the winner's one-knob neighbours, repeated in rounds with it ({levels} intervals)"
             if phase_run else "Verdict per knob from the search's matched pairs (single-process measurements; "
             "no verdict phase)")
    table = Table(title=title, title_justify="left")
    table.add_column("question")
    table.add_column("knob")
    table.add_column("verdict")
    for e in effects:
        style = "" if e.measurable else "dim"
        table.add_row(e.question, e.knob, e.verdict, style=style)
    return table
