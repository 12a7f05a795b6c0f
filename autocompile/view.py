"""Rich renderings of measurements for the terminal."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from autocompile.timeline import wall_split


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def measurement_table(result: dict[str, Any], name: str) -> Table:
    """One trial, every number the worker measured, with its spread."""
    table = Table(title=f"autocompile measurement: {name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    status = result.get("status", "?")
    table.add_row("status", f"[{'green' if status == 'ok' else 'red'}]{status}[/]")
    if status != "ok":
        table.add_row("failure", str(result.get("failure", "-")))
        table.add_row("reason", str(result.get("reason", "-")))
    else:
        windows = result["step_s_windows"]
        table.add_row("tokens/s (median of windows)", f"{result['tokens_per_s']:,.0f}  (CV {result['step_s_cv']:.1%})")
        table.add_row("step time", f"{result['step_s'] * 1e3:.2f} ms  (windows {min(windows) * 1e3:.2f} to "
                      f"{max(windows) * 1e3:.2f} ms, n={len(windows)})")
        dynamo = result.get("dynamo_compile_s", {}).get("_compile.compile_inner")
        table.add_row("compile time", f"{result['compile_s']:.2f} s  (first step {result['first_step_s']:.2f} s"
                      + (f", dynamo's own total {dynamo:.2f} s" if dynamo is not None else "") + ")")
        table.add_row("compiled", ", ".join(result["compiled"]) or "nothing (eager)")
        table.add_row("graphs / breaks / recompiles in timed part",
                      f"{result['graph_count']} / {result['graph_breaks']} / {result['recompiles_timed']}")
        for reason, count in result.get("graph_break_reasons", {}).items():
            table.add_row(f"  graph break x{count}", reason)
        table.add_row("peak memory", fmt_bytes(result.get("peak_memory_bytes")))
        table.add_row("MFU", f"{result['mfu']:.1%}" if result.get("mfu") is not None else "- (no known peak)")
        losses = result.get("losses", [])
        if losses:
            table.add_row("loss first / last", f"{losses[0]:.4f} / {losses[-1]:.4f}  ({len(losses)} steps)")
    split = wall_split(result)
    if split:
        table.add_row("wall time", f"{result['wall_s']:.1f} s = " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f}" for k, v in split.items()))
    elif "wall_s" in result:
        table.add_row("wall time", f"{result['wall_s']:.1f} s")
    env = result.get("environment") or {}
    if env:
        table.add_row("environment", f"torch {env.get('torch')}, {env.get('device_name')}, world size "
                      f"{env.get('world_size')}, {env.get('threads')} threads")
    table.add_row("trial directory", str(result.get("trial_dir", "-")))
    return table
