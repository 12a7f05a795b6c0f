"""The winner's knobs applied in the user's own run: the script's ``torch.compile`` calls (and its ``prepare``)
taken over exactly as its trial's agent took them over (:mod:`autocompile.trial.script.agent`), with nothing timed.

Torch only: this runs inside the user's processes, where only PyTorch may be installed.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

import torch
from torch import nn

from autocompile.config.choices import Knobs
from autocompile.config.script_settings import calls_prepare
from autocompile.trial.program.apply_parts import apply_optimize_ddp
from autocompile.trial.script.agent import Agent, activate, patch_compile


class Watched:
    """What a run of the winner keeps of the meter: the models the script handed over (nothing is timed)."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []

    def watch(self, runner: nn.Module, model: nn.Module) -> None:
        self.models.append(model)

    def install(self) -> None:
        pass


class WinnerAgent(Agent):
    """The winner's knobs applied to the script's ``torch.compile`` calls (and its ``prepare``) exactly as its
    trial applied them, in the user's own run: no timing, no early end, no recompile-limit failure."""

    def __init__(self, knobs: Knobs, prepares: bool, device: str | None = None, strict: bool = True) -> None:
        self.spec = None  # type: ignore[assignment]
        self.setup(knobs, device or ("cuda" if torch.cuda.is_available() else "cpu"), prepares, strict)
        self.meter = Watched()

    def install(self) -> None:
        apply_optimize_ddp(self.config.ddp, self.world_size > 1)
        patch_compile()
        if self.compiles_anything:
            self.find_model()


def run_winner(script: str, argv: list[str], knobs: Knobs) -> None:
    """Run ``script`` with ``argv`` as ``python script ...`` would, its compile taken over by ``knobs`` (a
    study's winner): what ``best_config.py`` of a script study calls, in each process torchrun starts."""
    activate(WinnerAgent(knobs, calls_prepare(script)))
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python puts the script's folder first
    runpy.run_path(script, run_name="__main__")


def prepare_winner(model: nn.Module, optimizer: Any, knobs: Knobs, device: str, where: str) -> list[str]:
    """``autocompile.prepare`` with a winner in the user's own run (no trial, no agent installed): the knobs
    applied as a trial of a script that calls ``prepare`` applies them; knobs of another kind of study that do
    not apply to a script are dropped. Returns the names compiled."""
    winner = WinnerAgent(knobs, prepares=True, device=device, strict=False)
    apply_optimize_ddp(winner.config.ddp, winner.world_size > 1)
    winner.prepare(model, optimizer, where)
    return winner.compiled
