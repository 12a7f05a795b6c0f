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

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, TypedDict

import optuna

from autocompile.config.choices import Knobs
from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.settings import ConfigError, Settings
from autocompile.study.records.optuna_store import REFERENCE, file_lock
from autocompile.trial.launcher import launch
from autocompile.trial.timing.result import TrialResult

log = logging.getLogger(__name__)

REFERENCE_KNOBS = {"compile.scope": "none", "amp.dtype": "none", "ac.policy": "none"}


class Reference(TypedDict, total=False):
    """The numerics reference as the study keeps it (the ``reference`` study attribute): what its run measured,
    what it is (``basis``, ``knobs``) and the attempts that ran out of memory before it."""

    status: str
    failure: str | None
    reason: str | None
    losses: list[float] | None
    """Loss per step: every trial's losses are compared with these."""
    step_s: float | None
    step_s_cv: float | None
    windows: int | None
    tokens_per_s: float | None
    trial_dir: str | None
    wall_s: float | None
    basis: str
    """What it is: eager fp32, or the fallback it took (checkpointed, then mixed precision)."""
    knobs: Knobs
    out_of_memory: list[OutOfMemory]
    compile_calls: list[dict[str, Any]]
    """A script's own ``torch.compile`` calls (its ``script.compile_calls``): the baseline of it as written."""
    structure: dict[str, bool] | None
    """A script's model as its run found it (``units.Structure``): what its space may offer (:func:`probed_env`)."""
    backwards_per_step: int
    """A script's most ``backward()`` calls before one optimizer step: over 1, it accumulates gradients."""
    peak_bytes: float | None
    """Its peak memory (warm-up or timed, bytes): what a process in flight holds."""
    reused_from: str
    """Present when it was not run here: the study of the same identity (an exact answer) that measured it."""
    never_stepped: bool
    """A script's eager run that failed before its first training step (it exited, or raised, on its own): every
    configuration runs the same script, so the study stops there (:func:`check_script_runs`)."""


class OutOfMemory(TypedDict):
    """An attempt at the reference that ran out of memory."""

    basis: str
    reason: str | None


FP32 = "eager fp32"


def reference(study: optuna.Study) -> Reference | None:
    """The study's measured reference, if it has one that succeeded."""
    ref: Reference | None = study.user_attrs.get(REFERENCE)
    return ref if ref and ref.get("status") == "ok" else None


def reference_peak(ref: Reference | None) -> float | None:
    """The reference run's peak memory in bytes (as kept, else its ``result.json``), or None: what a process in
    flight holds."""
    if ref and ref.get("peak_bytes"):
        return ref["peak_bytes"]
    path = Path(ref["trial_dir"]) / "result.json" if ref and ref.get("trial_dir") else None
    if path is None or not path.is_file():
        return None
    return peak_of(TrialResult.from_json(json.loads(path.read_text())))


def peak_of(result: TrialResult) -> float | None:
    """A run's peak memory in bytes, warm-up or timed; None where it reported none."""
    return float(max(result.peak_memory_bytes or 0, result.warmup_peak_memory_bytes or 0)) or None


def numerics(ref: Reference | None) -> str:
    """A trial's ``numerics``: ``checked`` (against eager fp32), against what else, or why unchecked."""
    if ref is None:
        return "unchecked: no eager reference"
    what = ref.get("basis", FP32)  # a reference recorded before the fallbacks: eager fp32
    return "checked" if what == FP32 else f"checked against {what}"


def attempts(settings: Settings) -> list[tuple[str, str, Knobs]]:
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


def ensure_reference(study: optuna.Study, settings: Settings, run_dir: Path) -> Reference | None:
    """Measure the reference unless the study has it (a resumed study, another tuner); after an out-of-memory,
    the next of :func:`attempts`."""
    if (found := reference(study)) is not None:
        return found
    with file_lock(run_dir / "reference.lock"):  # tuners of one study: one measures it, in one directory
        if (found := reference(study)) is not None:
            return found
        return _measure_reference(study, settings, run_dir)


def _measure_reference(study: optuna.Study, settings: Settings, run_dir: Path) -> Reference | None:
    failed: list[OutOfMemory] = []
    result = TrialResult(status="failed", reason="no reference to measure")
    for name, what, knobs in attempts(settings):
        config = TrialConfig.from_flat(knobs, settings.env, strict=False)
        log.info("measuring the numerics reference (%s) in %s", what, run_dir / name)
        result = launch(run_dir / name, settings.trial_spec(config), cache_dir=settings.cache_dir)
        if result.ok or result.failure != "oom":
            break
        failed.append(OutOfMemory(basis=what, reason=result.reason))
        log.warning("the numerics reference (%s) ran out of memory: %s", what, result.reason)
    kept = Reference(status=result.status, basis=what, knobs=knobs, out_of_memory=failed)
    for key in ("failure", "reason", "losses", "step_s", "step_s_cv", "windows", "tokens_per_s", "trial_dir",
                "wall_s"):
        if (value := getattr(result, key)) is not None:
            kept[key] = value  # type: ignore[literal-required]
    for key in ("compile_calls", "structure", "backwards_per_step"):
        if result.script and result.script.get(key):
            kept[key] = result.script[key]  # type: ignore[literal-required]
    if peak := peak_of(result):
        kept["peak_bytes"] = peak
    if settings.script.given and result.failure in ("script_ended", "exception") and result.optimizer_steps == 0:
        kept["never_stepped"] = True
    study.set_user_attr(REFERENCE, kept)
    if not result.ok:
        if not kept.get("never_stepped"):  # else the study stops: check_script_runs says why
            log.warning("the numerics reference failed (%s): trials are marked 'unchecked' and none can win",
                        result.reason)
        return None
    if failed:
        log.warning("the numerics reference is %s: every trial's losses are compared with it", what)
    return reference(study)


def check_script_runs(study: optuna.Study) -> None:
    """Raise (one line) when the script's eager run ended before its first training step: its arguments, its
    environment (pytorch/examples' FSDP2 example needs 2 GPUs and exits), a file it cannot open. Every trial would
    end the same way, a minute of a study or an hour of a GPU's for nothing."""
    failed: Reference = study.user_attrs.get(REFERENCE) or {}
    if failed.get("never_stepped"):
        raise ConfigError(f"the script does not train as started (its eager run): {failed.get('reason')} (its logs: "
                          f"{failed.get('trial_dir')}); every trial runs the same script: make it train, then run "
                          "again")


def probed_env(env: Env, found: Reference | None) -> Env:
    """A script study's environment narrowed by what its reference run saw: the model's structure (no repeated
    blocks: no regional compile nor per-block checkpointing) and gradient accumulation (no CUDA-graph modes, whose
    replays would overwrite the gradients accumulated before them), as a model study reads them before it starts."""
    if found is None:
        return env
    facts: dict[str, Any] = dict(found.get("structure") or {})
    if found.get("backwards_per_step", 0) > 1:
        facts["accumulates"] = True
    return dataclasses.replace(env, **facts) if facts else env
