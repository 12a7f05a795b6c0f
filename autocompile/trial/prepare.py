"""``model, optimizer = autocompile.prepare(model, optimizer)``: the one line a script adds to run a winner.

Outside a study, with no winner named, it returns the very objects it was given: the script trains exactly as
before. A winner is named by ``best_config=`` or the ``AUTOCOMPILE_BEST_CONFIG`` variable (a study's
``best_config.yaml``); its knobs are then applied to the objects as a trial applied them: activation
checkpointing per block, then the compile scope in place (``module``: the model's forward; ``regional``: each
block and the rest) with the winner's mode, options, dynamic and fullgraph, and dynamo's ``optimize_ddp``.

Inside a script study's trial (the agent is loaded), ``prepare`` hands the model to the agent as
``torch.compile(model)`` would: the trial's compile knobs are applied to it in place and the meter counts its
forward calls, so a script that calls ``prepare`` needs no ``torch.compile`` of its own (one that has both is
taken over once). A winner named in the environment is not applied inside a trial: the trial's knobs are.

Not yet: the knobs that rebuild the optimizer (``optim.impl``) or wrap the model (DDP/FSDP2 order), and the
per-block activation checkpointing inside a trial (a script study's space offers compile knobs only, the same
for a script that calls ``prepare`` as for one that calls ``torch.compile``).

Torch only (PyYAML when a winner is read): it runs inside the user's script.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autocompile.config.knobs import Env, TrialConfig
from autocompile.trial.apply_parts import Compilers, apply_ac, apply_optimize_ddp, compile_targets, compile_units
from autocompile.trial.programs import CompileLog
from autocompile.trial.step import compile_kwargs

log = logging.getLogger(__name__)
WINNER_VAR = "AUTOCOMPILE_BEST_CONFIG"
NOT_YET = {"optim.impl": "default", "parallel.strategy": "ddp", "ddp.wrap_order": "ddp_of_compiled",
           "compile.optimizer": False, "compile.compiled_autograd": False, "amp.dtype": "none"}
"""Knobs prepare() does not apply yet, with the value it runs as: a winner that sets another one is refused."""


def prepare(model: nn.Module, optimizer: Any = None, *, best_config: str | os.PathLike[str] | None = None) -> Any:
    """``(model, optimizer)``: unchanged without a winner; with one, ``model`` compiled (and checkpointed) in place
    as the winner says. Returns the same two objects either way (``model`` alone when no optimizer is given)."""
    script_agent = sys.modules.get("autocompile.trial.script_agent")  # loaded only in a script trial's processes
    agent = script_agent.agent() if script_agent is not None else None
    if agent is not None:  # a trial of a script study: its knobs, not a winner's
        agent.take_over(model, {}, script_agent.caller_of_prepare(), in_place=True)
        return model if optimizer is None else (model, optimizer)
    path = best_config or os.environ.get(WINNER_VAR)
    if path:
        apply_winner(model, winner_knobs(Path(path)))
    return model if optimizer is None else (model, optimizer)


def winner_knobs(path: Path) -> dict[str, Any]:
    """The ``knobs`` of a study's ``best_config.yaml``."""
    import yaml

    knobs = dict((yaml.safe_load(path.read_text()) or {}).get("knobs") or {})
    if not knobs:
        raise ValueError(f"{path} has no knobs: give a study's best_config.yaml")
    return knobs


def apply_winner(model: nn.Module, knobs: dict[str, Any]) -> list[str]:
    """Apply ``knobs`` to ``model`` in place; returns the names of the units compiled."""
    unsupported = {k: v for k, v in knobs.items() if k in NOT_YET and v != NOT_YET[k]}
    if unsupported:
        raise ValueError(f"prepare() cannot apply {unsupported} yet: use autocompile.apply for this winner")
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    device = next(model.parameters()).device.type
    env = Env.detect("cuda" if device == "cuda" else "cpu", world_size, False)
    config = TrialConfig.from_flat(knobs, env, strict=False)
    apply_ac(model, config.ac)
    apply_optimize_ddp(config.ddp, world_size > 1)
    targets = compile_targets(model, config.compile)
    graphs = CompileLog()
    compiled = compile_units(targets, Compilers(graphs, compile_kwargs(config.compile))("model"), graphs)
    log.info("autocompile.prepare: compiled %s", ", ".join(compiled) or "nothing (eager)")
    return compiled
