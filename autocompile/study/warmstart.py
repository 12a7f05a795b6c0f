"""The winner's warm start: its compile artifacts copied next to ``best_config.py`` and a fresh process
measured with them loaded, once per winner (see :mod:`autocompile.trial.warmstart` for the worker side)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.trial.launcher import launch
from autocompile.trial.warmstart import ARTIFACTS

log = logging.getLogger(__name__)


def take_home(settings: Any, best: dict[str, Any] | None, run_dir: Path, launch: Any) -> dict[str, Any] | None:
    """Copy the winner's artifacts next to ``best_config.py`` and measure a warm start of it.

    ``launch(trial_dir, spec)`` runs a trial (``launcher.launch``); ``settings`` are the study's.
    Returns cold and warm compile seconds and the saving, or None when the winner has no artifacts."""
    artifacts = ((best or {}).get("result") or {}).get("compile_artifacts")
    if not artifacts or not Path(artifacts["path"]).is_file():
        return None
    target = run_dir / ARTIFACTS
    shutil.copyfile(artifacts["path"], target)
    config = TrialConfig.from_flat(best["config"], settings.env, strict=False)
    spec = settings.trial_spec(config)
    spec = dataclasses.replace(spec, measure=dataclasses.replace(spec.measure, artifacts=str(target.resolve())))
    log.info("measuring a warm start of trial %s with %s", best["number"], target)
    result = launch(run_dir / "warm_start", spec)
    cold = best["result"]["compile_s"]
    if result.get("status") != "ok":
        return {"artifacts": str(target), "trial": best["number"], "cold_compile_s": cold, "status": "failed",
                "reason": result.get("reason")}
    warm = result["compile_s"]
    return {"artifacts": str(target), "trial": best["number"], "status": "ok", "cold_compile_s": cold,
            "warm_compile_s": warm, "saved_s": cold - warm, "loaded": result.get("artifacts_loaded"),
            "trial_dir": result.get("trial_dir")}


def warm_start(study: optuna.Study, settings: Settings, best: Any, run_dir: Path) -> dict[str, Any] | None:
    """The winner's warm start (``best``: the report's entry), measured once per winner (a resumed study keeps
    the measurement)."""
    done = study.user_attrs.get("warm_start")
    if best is None or (done and done.get("trial") == best.number):
        return done if best is not None else None
    found = take_home(settings, best.as_dict(), run_dir, launch)
    if found is not None:
        study.set_user_attr("warm_start", found)
    return found
