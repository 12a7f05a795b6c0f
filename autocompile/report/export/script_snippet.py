"""``best_config.py`` of a script study: the user's own script, run with the winner applied as its trial did.

    python outputs/<study>/best_config.py                 # the study's script and arguments, from its directory
    python outputs/<study>/best_config.py --max_iters=5000  # other arguments
    torchrun --nproc-per-node=2 outputs/<study>/best_config.py

It takes over the script's ``torch.compile`` calls (and its ``autocompile.prepare``) with the winner's knobs
(:func:`autocompile.trial.script.winner_run.run_winner`), so the script needs no line changed. A script that calls
``prepare`` can instead name the winner in the environment: ``AUTOCOMPILE_BEST_CONFIG=.../best_config.yaml``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TypedDict

from autocompile.config.choices import Knobs
from autocompile.config.settings import Settings
from autocompile.report.findings.entry import Entry

SCRIPT_SNIPPET = '''"""Run {script} with the best configuration autocompile found (study {study}, trial {number}).

Measured: {tokens:,.0f} {rate}, {step_ms:.2f} ms/step, compile {compile_s:.1f} s.
Run it (from {cwd}, where the study ran the script):
    {run}
Arguments after best_config.py replace the study's. The script's torch.compile calls (and autocompile.prepare)
apply the winner below, exactly as its trial did; the script itself is unchanged.
Measure it again:  {command}
"""

import os
import sys

from autocompile.trial.script.winner_run import run_winner

KNOBS = {knobs}
SCRIPT = {script!r}
ARGS = {args!r}  # the study's script.args
STUDY_DIR = {cwd!r}  # where the study ran the script: its relative paths start there

if __name__ == "__main__":
    if not os.path.isfile(SCRIPT):
        os.chdir(STUDY_DIR)
    run_winner(SCRIPT, sys.argv[1:] or ARGS, KNOBS)
'''


RUN = "Run your script with it"
PREPARE = "Or, where it calls autocompile.prepare"


class RunEntries(TypedDict, total=False):
    """``best_config.yaml``'s commands of a script study (none for a model study)."""

    run: str
    run_with_prepare: str


def run_commands(settings: Settings, run_dir: Path) -> dict[str, str]:
    """How a user runs the script with the winner (none for a study of autocompile's loop): through
    ``best_config.py`` (no line changed), or with the winner named for ``autocompile.prepare``."""
    if not settings.script.given:
        return {}
    w = settings.workload
    best = str((run_dir / "best_config.py").resolve())
    launcher = (["torchrun", f"--nproc-per-node={w.nproc_per_node}", *([f"--nnodes={w.nnodes}"] if w.nnodes > 1
                                                                        else [])] if w.world_size > 1 else ["python"])
    if settings.script.launcher == "accelerate":  # as the trials ran it: the user's accelerate config
        launcher = ["accelerate", "launch", *settings.script.accelerate_args(w.world_size)]
    script = [settings.script.path, *settings.script.argv()]
    return {RUN: shlex.join([*launcher, best]),
            PREPARE: f"AUTOCOMPILE_BEST_CONFIG={shlex.quote(str((run_dir / 'best_config.yaml').resolve()))} "
                            + shlex.join([*launcher, *script])}


def script_snippet(settings: Settings, best: Entry, command: str, run_dir: Path) -> str:
    r = best.result
    knobs: Knobs = best.config
    return SCRIPT_SNIPPET.format(
        script=settings.script.path, study=settings.study.name, number=best.number, tokens=r.tokens_per_s,
        rate=f"{r.unit}/s", step_ms=r.step_s * 1e3, compile_s=r.compile_s, cwd=str(Path.cwd()),
        run=run_commands(settings, run_dir)[RUN], command=command.replace("\\", "\\\\").replace('"""', "'''"),
        knobs="{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in knobs.items()) + "}", args=settings.script.argv())


def run_entries(commands: dict[str, str]) -> RunEntries:
    """``best_config.yaml``'s ``run`` (the script with the winner) and ``run_with_prepare``, for a script study."""
    entries: RunEntries = {}
    if RUN in commands:
        entries["run"] = commands[RUN]
    if PREPARE in commands:
        entries["run_with_prepare"] = commands[PREPARE]
    return entries
