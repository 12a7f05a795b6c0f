"""``task=measure``: one configuration, one trial, one table."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from autocompile.config.knobs import TrialConfig, describe
from autocompile.config.settings import Settings
from autocompile.trial.launcher import launch
from autocompile.trial.timing.result import TrialResult

log = logging.getLogger(__name__)


def measure(settings: Settings, run_dir: Path) -> tuple[str, TrialResult]:
    """Measure the command line's configuration once; its name and the worker's result (the app prints it)."""
    env = settings.env
    config = TrialConfig.from_flat(settings.fixed_knobs, env)
    trial_dir = run_dir / "measure" / time.strftime("%Y%m%d-%H%M%S")
    name = describe(config, env)
    log.info("measuring %s in %s (%s inductor cache)", name, trial_dir, settings.measure.cache)
    result = launch(trial_dir, settings.trial_spec(config), cache_dir=settings.cache_dir)
    return name, result
