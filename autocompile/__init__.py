"""autocompile: find the best way to apply torch.compile to a training job, by measurement.

The public API is imported lazily: ``import autocompile`` stays cheap for the command line, and
the worker's own clock starts before torch is imported, so its timeline shows the import cost.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "prepare": "autocompile.trial.script.prepare",
    "apply": "autocompile.trial.program.step", "lm_loss": "autocompile.trial.program.step",
    "TrainStep": "autocompile.trial.program.step",
    "Env": "autocompile.config.knobs", "TrialConfig": "autocompile.config.knobs",
    "KnobError": "autocompile.config.knobs", "KNOBS": "autocompile.config.knobs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autocompile' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    for export, where in _EXPORTS.items():
        if where == module.__name__:
            globals()[export] = getattr(module, export)
    return globals()[name]
