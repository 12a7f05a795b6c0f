"""The confirmation phase in the terminal: the winner, its paired intervals against the baselines, and the race."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autocompile.study.phases.confirmation import Confirmation, RaceRow


def print_confirmed(console: Console, outcome: Confirmation | None) -> None:
    """The confirmation phase: winner, its paired intervals against the baselines, and the race table."""
    if not outcome:
        console.print("Not confirmed: the search's best was measured once (study.confirm_top=0, or fewer than "
                      "two feasible candidates).")
        return
    w = outcome.winner
    if w is None:
        console.print(f"[red]Not confirmed: {outcome.reason}")
        return
    side = outcome.side_by_side
    why = outcome.method.get("why")
    over = (f"side by side in {outcome.rounds} fresh processes ({outcome.windows} paired windows each)"
            if side else f"over {outcome.rounds} interleaved rounds"
            + (f" (fresh processes, not side by side: {why})" if why else ""))
    console.print(f"\n[bold green]Confirmed[/] {over}: {outcome.conclusion}.")
    console.print(f"  Recommended (trial {w.trial}): {w.name or 'defaults'}; steps "
                  f"{(w.step_s_geomean or 0.0) * 1e3:.2f} ms (geometric mean of its repeats), compile "
                  f"{w.compile_s_cold:.1f} s (cold, search)")
    if outcome.compile_spread:
        console.print(f"  Cold compile spread in time-to-train intervals: {outcome.compile_spread.cv:.1%} "
                      f"({outcome.compile_spread.source}); every ± and [ ] is a 95% interval")
    for name, gain in outcome.gains.items():
        console.print(f"  step time vs {name}: {gain.text} ({'paired windows' if side else 'paired by round'}; "
                      "negative = faster)")
    table = Table(title="Confirmation race (step time per candidate, "
                  + ("paired window by window in each process)" if side else "paired by round)"), title_justify="left")
    for col in ("candidate", "configuration", "rounds", "ms/step", "vs leader (score)"):
        table.add_column(col)
    for c in outcome.candidates:
        vs = c.vs_leader
        table.add_row(c.label + (f" ({c.baseline})" if c.baseline else ""), c.name or "defaults",
                      str(c.rounds), f"{(c.step_s_geomean or 0.0) * 1e3:.2f}",
                      "leader" if c.label == outcome.leader else (
                          f"{vs.change:+.1%} [{vs.low * 100:+.1f}, {vs.high * 100:+.1f}]"
                          if vs and vs.low is not None and vs.high is not None else "-") + race_status(c, outcome))
    console.print(table)


def race_status(candidate: RaceRow, outcome: Confirmation) -> str:
    """How a candidate stands against the leader, in words: within the tie margin, measurably slower, or
    undetermined with the processes that would decide it."""
    status = candidate.status
    if status in (None, "leader"):
        return ""
    if status != "undetermined":
        return f" {status}" + (f" (within +-{outcome.tie_margin:.0%})" if status == "tied" else "")
    return " undetermined" + (f" ({candidate.decide})" if candidate.decide else "")
