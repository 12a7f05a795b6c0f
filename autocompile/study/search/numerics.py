"""The numerics reference: the eager fp32 program on the study's workload, measured once per study.

Every compiled trial's per-step losses are compared with it (``objective.loss_rtol``). It is not a
trial: it runs whatever the study fixes or searches (a fixed ``compile.scope``, ``study.baselines=
false``, several slots or tuners), so the check never switches itself off. A study whose reference
failed marks its trials "unchecked", which never counts as feasible.

A job sized for mixed precision and checkpointing may not fit in eager fp32. When the reference runs out
of memory it is measured again with per-block activation checkpointing, which computes the same numbers
(the recomputation replays each block's forward with the RNG state it had: torch.utils.checkpoint,
``preserve_rng_state``), and if that does not fit either, in eager mixed precision with checkpointing:
then the check compares every trial with the eager program at that precision, which the study says
(the reference's ``basis``, each trial's ``numerics``) rather than leaving every trial unchecked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.study.records.optuna_store import REFERENCE
from autocompile.trial.launcher import launch

log = logging.getLogger(__name__)

REFERENCE_KNOBS = {"compile.scope": "none", "amp.dtype": "none", "ac.policy": "none"}
KEPT = ("status", "failure", "reason", "losses", "step_s", "step_s_cv", "tokens_per_s", "trial_dir", "wall_s")
FP32 = "eager fp32"


def reference(study: optuna.Study) -> dict[str, Any] | None:
    """The study's measured reference, if it has one that succeeded."""
    ref = study.user_attrs.get(REFERENCE)
    return ref if ref and ref.get("status") == "ok" else None


def numerics(ref: dict[str, Any] | None) -> str:
    """A trial's ``numerics``: ``checked`` (against eager fp32), against what else, or why unchecked."""
    if ref is None:
        return "unchecked: no eager reference"
    what = ref.get("basis", FP32)  # a reference recorded before the fallbacks: eager fp32
    return "checked" if what == FP32 else f"checked against {what}"


def attempts(settings: Settings) -> list[tuple[str, str, dict[str, Any]]]:
    """(directory name, basis, knobs) in the order they are tried: each later one saves memory the earlier
    did not. One that does not apply to this model (no repeated blocks to checkpoint) is left out."""
    dtype = settings.fixed_knobs.get("amp.dtype")
    dtype = dtype if dtype not in (None, "none") else "bfloat16"
    found = [("reference", FP32, REFERENCE_KNOBS)]
    checkpointed = {**REFERENCE_KNOBS, "ac.policy": "block"}
    if TrialConfig.from_flat(checkpointed, settings.env, strict=False).ac.policy == "block":
        found.append(("reference_ac", f"{FP32} with per-block activation checkpointing (the same numbers)",
                      checkpointed))
    mixed = {**checkpointed, "amp.dtype": dtype}
    config = TrialConfig.from_flat(mixed, settings.env, strict=False)
    if config.amp.dtype == dtype:
        what = "with per-block activation checkpointing" if config.ac.policy == "block" else "without checkpointing"
        found.append((f"reference_{dtype}", f"eager {dtype} {what} (eager fp32 does not fit in memory)", mixed))
    return found


def ensure_reference(study: optuna.Study, settings: Settings, run_dir: Path) -> dict[str, Any] | None:
    """Measure the reference unless the study has it (a resumed study, another tuner); after an out-of-memory,
    the next of :func:`attempts`."""
    if (found := reference(study)) is not None:
        return found
    failed: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    for name, what, knobs in attempts(settings):
        config = TrialConfig.from_flat(knobs, settings.env, strict=False)
        log.info("measuring the numerics reference (%s) in %s", what, run_dir / name)
        result = launch(run_dir / name, settings.trial_spec(config), cache_dir=settings.cache_dir)
        if result.get("status") == "ok" or result.get("failure") != "oom":
            break
        failed.append({"basis": what, "reason": result.get("reason")})
        log.warning("the numerics reference (%s) ran out of memory: %s", what, result.get("reason"))
    kept = {k: result[k] for k in KEPT if k in result}
    study.set_user_attr(REFERENCE, {**kept, "basis": what, "knobs": knobs, "out_of_memory": failed})
    if result.get("status") != "ok":
        log.warning("the numerics reference failed (%s): trials are marked 'unchecked' and none can win",
                    result.get("reason"))
        return None
    if failed:
        log.warning("the numerics reference is %s: every trial's losses are compared with it", what)
    return reference(study)
