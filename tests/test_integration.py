"""Real inductor compiles through torchrun: slow (tens of seconds each), marked integration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_ok, make_spec, run_trials
from tests.loading import load_file

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


@pytest.mark.timeout(1800)  # its own subprocess limit: cold inductor compiles plus the numerics reference
def test_real_inductor_study_of_8_trials_recommends_and_writes_a_working_snippet(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    import torch

    from autocompile.workload.models import gpt2

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [sys.executable, "-m", "autocompile", "+model=gpt2-tiny", "study.n_trials=8", "workload.batch_size=4",
         "workload.seq_len=[64]", "measure.windows=3", "measure.window_steps=3", "tracking.enabled=false",
         "study.confirm_top=0", "study.verdicts=none", "measure.max_timed_s=2",  # phases: tests/test_confirm.py
         f"output_root={tmp_path}"], cwd=root, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    for words in ("Best", "Pareto front", "Verdict per", "best_config.py", "Measure it again"):
        assert words in run.stdout
    run_dir = next(tmp_path.glob("*/summary.json")).parent
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["counts"]  # near-miss prunes measured once more come on top of study.n_trials
    assert counts["trials"] - counts["remeasured"] == 8 and counts["remeasured"] <= 2 and summary["best"] is not None
    module = load_file(run_dir / "best_config.py")
    model = gpt2(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=512)
    step = module.build_step(model, torch.optim.AdamW(model.parameters()))
    assert step.compiled == summary["best"]["result"]["compiled"]


def test_non_editable_install_finds_its_configs(tmp_path: Path) -> None:
    """A wheel (not the source tree) carries conf/: build it, install it into a fresh venv, run from elsewhere."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(root)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("autocompile-*.whl")
    venv = tmp_path / "venv"
    # System site-packages provide torch & co.; the wheel itself goes into the venv without dependencies.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import autocompile.app as a; print(a.__file__, a.CONF_DIR)"],
                           cwd=elsewhere, capture_output=True, text=True, check=True).stdout
    assert str(venv) in where.split()[0] and str(venv) in where.split()[1], where
    helped = subprocess.run([str(python), "-m", "autocompile", "--help"], cwd=elsewhere, capture_output=True,
                            text=True, timeout=300)
    assert helped.returncode == 0, helped.stderr
    shipped = ", ".join(sorted(p.stem for p in (root / "conf" / "model").glob("*.yaml")))  # every family's config
    assert f"model: {shipped}" in helped.stdout
    bad = subprocess.run([str(python), "-m", "autocompile", "+model=gpt3"], cwd=elsewhere, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and f"choose one of {shipped}" in bad.stderr
