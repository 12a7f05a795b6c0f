"""``model, optimizer = autocompile.prepare(model, optimizer)``: the one line a script adds to run a winner.

Outside a study, with no winner named, it returns the very objects it was given: the script trains exactly as
before. A winner is named by ``best_config=`` or the ``AUTOCOMPILE_BEST_CONFIG`` variable (a study's
``best_config.yaml``); its knobs are then applied to the objects as a trial applied them: activation
checkpointing per block, then the compile scope in place (``module``: the model's forward; ``regional``: each
block and the rest) with the winner's mode, options, dynamic and fullgraph, and dynamo's ``optimize_ddp``.

Inside a script study's trial (the agent is loaded), ``prepare`` hands the objects to the agent: activation
checkpointing per block (``ac.policy``), the optimizer's implementation set on the script's own optimizer
(``optim.impl``: its scheduler and GradScaler keep working on it), then the compile knobs in place, and under
``ddp.wrap_order=compile_of_ddp`` the DDP wrapper the script builds around the model compiled in place. A
script whose file calls ``prepare`` (:func:`autocompile.config.script_settings.calls_prepare`) is asked those knobs too;
a script that has both ``prepare`` and its own ``torch.compile`` is taken over once. A winner named in the
environment is not applied inside a trial: the trial's knobs are.

Not yet: FSDP2, the compiled optimizer step, compiled autograd and autocast (``NOT_YET``): the script runs
its own versions of those.

Torch only (PyYAML when a winner is read): it runs inside the user's script.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from autocompile.config.choices import Knobs

log = logging.getLogger(__name__)
WINNER_VAR = "AUTOCOMPILE_BEST_CONFIG"
NOT_YET = {"parallel.strategy": "ddp", "compile.optimizer": False, "compile.compiled_autograd": False,
           "amp.dtype": "none"}
"""Knobs prepare() does not apply yet, with the value it runs as: a winner that sets another one is refused."""


def prepare(model: nn.Module, optimizer: Any = None, *, best_config: str | os.PathLike[str] | None = None) -> Any:
    """``(model, optimizer)``: unchanged without a winner; with one, the same objects prepared in place as the
    winner says. Returns the same two objects either way (``model`` alone when no optimizer is given)."""
    script_agent = sys.modules.get("autocompile.trial.script.agent")  # loaded only in a script trial's processes
    agent = script_agent.agent() if script_agent is not None else None
    if agent is not None:  # a trial of a script study (or its winner's run): the agent's knobs
        agent.prepare(model, optimizer, script_agent.caller_of_prepare())
        return model if optimizer is None else (model, optimizer)
    path = best_config or os.environ.get(WINNER_VAR)
    if path:
        apply_winner(model, winner_knobs(Path(path)), optimizer)
    return model if optimizer is None else (model, optimizer)


def winner_knobs(path: Path) -> Knobs:
    """The ``knobs`` of a study's ``best_config.yaml``."""
    import yaml

    knobs = dict((yaml.safe_load(path.read_text()) or {}).get("knobs") or {})
    if not knobs:
        raise ValueError(f"{path} has no knobs: give a study's best_config.yaml")
    return knobs


def apply_winner(model: nn.Module, knobs: Knobs, optimizer: Any = None) -> list[str]:
    """Apply ``knobs`` to ``model`` (and ``optimizer``) in place; returns the names of the units compiled."""
    unsupported = {k: v for k, v in knobs.items() if (k in NOT_YET and v != NOT_YET[k])
                   or (k == "compile.scope" and v == "train_step")}  # the step is the script's own code
    if unsupported:
        raise ValueError(f"prepare() cannot apply {unsupported} yet: use autocompile.apply for this winner")
    from autocompile.trial.script.winner_run import prepare_winner

    device = next(model.parameters()).device.type
    compiled = prepare_winner(model, optimizer, knobs, "cuda" if device == "cuda" else "cpu", "autocompile.prepare")
    log.info("autocompile.prepare: compiled %s", ", ".join(compiled) or "nothing (eager)")
    return compiled
