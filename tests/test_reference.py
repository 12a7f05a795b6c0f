"""The numerics reference of a job that does not fit in eager fp32: measured again with checkpointing (the
same numbers), then in mixed precision, and said so, rather than leaving every trial unchecked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from autocompile.config.knobs import TrialConfig
from autocompile.study.search.numerics import REFERENCE_KNOBS, ensure_reference, numerics, reference
from tests.conftest import launched

TINY = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
        "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "measure.windows=2",
        "measure.window_steps=2", "measure.warmup_steps=2", "measure.max_timed_s=0.5", "tracking.enabled=false",
        "+workload.optimizer.foreach=false"]
# tests/models.py TinyLM saves, per forward at this size: 37120 bytes in fp32, 20736 with per-block
# checkpointing, 18688 in bf16, 14592 in bf16 with checkpointing.
FITS_CHECKPOINTED = "+model.activation_budget=25000"
FITS_BF16_CHECKPOINTED = "+model.activation_budget=16000"


def test_a_reference_out_of_memory_in_fp32_is_measured_checkpointed_with_the_same_losses(
        tmp_path: Path, settings_for: Any) -> None:
    settings = settings_for(*TINY, FITS_CHECKPOINTED)
    study = optuna.create_study()
    ref = ensure_reference(study, settings, tmp_path)
    assert ref is not None and ref == reference(study)  # kept in the study: a resumed study measures it no more
    assert ref["knobs"] == {**REFERENCE_KNOBS, "ac.policy": "block"}
    (oom,) = ref["out_of_memory"]
    assert oom["basis"] == "eager fp32" and "OutOfMemoryError" in oom["reason"]
    assert numerics(ref).startswith("checked against eager fp32 with per-block activation checkpointing")
    # Checkpointing recomputes the same numbers: the losses of the job without a memory limit, bit for bit.
    plain = settings_for(*TINY)
    unlimited = launched(tmp_path / "unlimited", plain.trial_spec(TrialConfig.from_flat(REFERENCE_KNOBS, plain.env)))
    assert unlimited["status"] == "ok"
    steps = min(len(unlimited["losses"]), len(ref["losses"]))  # each ran as many steps as its timing needed
    assert steps >= 4 and unlimited["losses"][:steps] == ref["losses"][:steps]


@pytest.mark.integration  # a real launch per fallback (20-30 s each on 2 cores)
def test_a_reference_that_fits_only_in_bf16_is_measured_so_and_says_it(tmp_path: Path, settings_for: Any) -> None:
    study = optuna.create_study()
    ref = ensure_reference(study, settings_for(*TINY, FITS_BF16_CHECKPOINTED), tmp_path)
    assert ref is not None and ref["knobs"] == {**REFERENCE_KNOBS, "ac.policy": "block", "amp.dtype": "bfloat16"}
    assert len(ref["out_of_memory"]) == 2  # fp32, then fp32 checkpointed
    assert "bfloat16" in numerics(ref) and numerics(ref).startswith("checked against eager")
    made = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())  # beside the lock the tuners share
    assert made == ["reference", "reference_ac", "reference_bfloat16"]


@pytest.mark.integration  # a real launch per fallback (20-30 s each on 2 cores)
def test_a_reference_that_fits_nowhere_leaves_the_trials_unchecked(tmp_path: Path, settings_for: Any) -> None:
    study = optuna.create_study()
    assert ensure_reference(study, settings_for(*TINY, "+model.activation_budget=1000"), tmp_path) is None
    assert len(study.user_attrs["reference"]["out_of_memory"]) == 3
    assert numerics(reference(study)) == "unchecked: no eager reference"
