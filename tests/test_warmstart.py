"""Take the winner home warm: a compiled trial keeps its artifacts, and a fresh process that loads
them compiles in less time (inductor: an integration test)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autocompile.config.knobs import TrialConfig
from autocompile.study.records.record import Measurement, user_attrs
from autocompile.study.search.warmstart import take_home, warm_start
from autocompile.trial.launcher import launch
from autocompile.trial.timing.compile_artifacts import ARTIFACTS, warm_line
from tests.conftest import assert_ok
from tests.jobs import FAST_MEASURE, Compose


@pytest.mark.integration
def test_the_winners_artifacts_make_a_fresh_process_compile_faster(tmp_path: Path, settings_for: Compose) -> None:
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "workload.batch_size=2",
                            "workload.seq_len=[16]", *FAST_MEASURE)
    config = TrialConfig.from_flat({"compile.scope": "module"}, settings.env)  # inductor
    cold = launch(tmp_path / "trials" / "0000", settings.trial_spec(config))
    assert_ok(cold)
    kept = cold["compile_artifacts"]
    assert kept["bytes"] > 0 and kept["entries"].get("inductor", 0) >= 1, kept
    # Recorded as the study keeps a trial (its numbers, not its files), then taken home as the study does.
    study = optuna.create_study()
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=cold["compile_s"], user_attrs=user_attrs(
        config=config.flat(), trial_dir=str(tmp_path / "trials" / "0000"), result=Measurement.from_dict(cold))))

    warm = warm_start(study, settings, study.trials[0], tmp_path)
    assert warm is not None and study.user_attrs["warm_start"] == warm  # what the report reads
    assert (tmp_path / ARTIFACTS).is_file()
    assert warm["status"] == "ok", warm
    assert warm["loaded"]["entries"] == kept["entries"]  # every artifact of the winner was loaded
    assert warm["warm_compile_s"] < warm["cold_compile_s"]  # measured, not assumed
    assert warm["saved_s"] == pytest.approx(warm["cold_compile_s"] - warm["warm_compile_s"])
    assert "Warm start: compile" in warm_line(warm) and "saves" in warm_line(warm)


def test_an_eager_or_aot_eager_winner_has_nothing_to_take_home(tmp_path: Path, settings_for: Compose) -> None:
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", *FAST_MEASURE)
    best = {"number": 3, "config": {}, "result": {"compile_artifacts": None, "compile_s": 1.0}}
    assert take_home(settings, best, tmp_path, launch) is None
    assert not (tmp_path / ARTIFACTS).exists()
    assert "no compile artifacts" in warm_line(None)
