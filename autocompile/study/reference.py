"""The numerics reference: the eager fp32 program on the study's workload, measured once per study.

Every compiled trial's per-step losses are compared with it (``objective.loss_rtol``). It is not a
trial: it runs whatever the study fixes or searches (a fixed ``compile.scope``, ``study.baselines=
false``, several slots or tuners), so the check never switches itself off. A study whose reference
failed marks its trials "unchecked", which never counts as feasible.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.trial.launcher import launch

log = logging.getLogger(__name__)

REFERENCE_KNOBS = {"compile.scope": "none", "amp.dtype": "none", "ac.policy": "none"}
KEPT = ("status", "failure", "reason", "losses", "step_s", "step_s_cv", "tokens_per_s", "trial_dir", "wall_s")


def reference(study: optuna.Study) -> dict[str, Any] | None:
    """The study's measured reference, if it has one that succeeded."""
    ref = study.user_attrs.get("reference")
    return ref if ref and ref.get("status") == "ok" else None


def ensure_reference(study: optuna.Study, settings: Settings, run_dir: Path) -> dict[str, Any] | None:
    """Measure the reference unless the study has it (a resumed study, another tuner)."""
    if (found := reference(study)) is not None:
        return found
    config = TrialConfig.from_flat(REFERENCE_KNOBS, settings.env)
    log.info("measuring the numerics reference (eager, fp32) in %s", run_dir / "reference")
    result = launch(run_dir / "reference", settings.trial_spec(config), cache_dir=settings.cache_dir)
    study.set_user_attr("reference", {k: result[k] for k in KEPT if k in result})
    if result.get("status") != "ok":
        log.warning("the numerics reference failed (%s): trials are marked 'unchecked' and none can win",
                    result.get("reason"))
        return None
    return reference(study)
