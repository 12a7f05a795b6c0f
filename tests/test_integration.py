"""Real inductor compiles through torchrun: slow (tens of seconds each), marked integration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_ok, make_spec, run_trials

pytestmark = pytest.mark.integration


def test_inductor_module_regional_and_train_step(tmp_path: Path) -> None:
    scopes = ["module", "regional", "train_step"]
    results = run_trials(tmp_path, [make_spec({"compile.scope": s}, windows=3) for s in scopes])
    for scope, result in zip(scopes, results, strict=True):
        assert_ok(result)
        assert result["dynamo_compile_s"]["_compile.compile_inner"] > 0
        assert result["recompiles_timed"] == 0, scope
        # Inductor writes its cold cache inside the trial directory.
        assert any((Path(result["trial_dir"]) / "inductor_cache").iterdir())
