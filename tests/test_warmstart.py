"""Take the winner home warm: a compiled trial keeps its artifacts, and a fresh process that loads them
compiles from them (inductor's cache-hit counters, not the wall clock: an integration test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autocompile.config.knobs import TrialConfig
from autocompile.study.records.record import Measurement, user_attrs
from autocompile.study.search.warmstart import Winner, take_home, warm_start
from autocompile.trial.launcher import launch
from autocompile.trial.timing.compile_artifacts import ARTIFACTS, warm_line
from tests.conftest import ROOT, assert_ok, launched
from tests.jobs import FAST_MEASURE, Compose

COUNTERS = """
from torch._dynamo.utils import counters
print(json.dumps({group: dict(counters[group]) for group in ("inductor", "aot_autograd", "frames")}))
"""

BUILD = """
import json, sys
from pathlib import Path

import torch

artifacts = Path(sys.argv[2])
if artifacts.is_file():
    torch.compiler.load_cache_artifacts(artifacts.read_bytes())
from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import TrialSpec
from autocompile.trial.program.build import build_candidate

spec = TrialSpec.read(Path(sys.argv[1]))  # the trial's own spec: the graphs the worker compiled
torch.set_num_threads(spec.threads)
config = TrialConfig.from_flat(spec.knobs, Env.detect("cpu", 1, spec.workload.shapes_vary))
built = build_candidate(spec, config, torch.device("cpu"), 0, 1)
built.run(4)  # the step, called: forward, backward and optimizer steps compile (or load) here
print("losses", [float(x) for x in built.losses])
"""


def fresh_process(code: str, args: list[str], tmp_path: Path, cwd: Path = ROOT,
                  threads: int | None = None) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a new Python process with an empty inductor cache of its own (only what it loads can
    hit), with ``threads`` intra-op threads (OMP_NUM_THREADS) if given; inductor's and AOT autograd's counters at
    its end, and its stdout."""
    cache = tmp_path / f"fresh_cache{len(list(tmp_path.glob('fresh_cache*')))}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    run = subprocess.run([sys.executable, "-c", "import json\n" + code + COUNTERS, *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stdout


def assert_compiled_warm(counters: dict[str, Any]) -> None:
    """Every FX graph inductor compiled came from the loaded artifacts: hits, no miss."""
    inductor = counters["inductor"]
    assert inductor.get("fxgraph_cache_hit", 0) >= 1 and inductor.get("fxgraph_cache_miss", 0) == 0, counters


@pytest.mark.integration
def test_the_winners_artifacts_make_a_fresh_process_compile_from_its_cache(tmp_path: Path,
                                                                          settings_for: Compose) -> None:
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "workload.batch_size=2",
                            "workload.seq_len=[16]", *FAST_MEASURE)
    config = TrialConfig.from_flat({"compile.scope": "module"}, settings.env)  # inductor
    cold = launched(tmp_path / "trials" / "0000", settings.trial_spec(config))
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
    assert warm["saved_s"] == pytest.approx(warm["cold_compile_s"] - warm["warm_compile_s"])
    # Its compile time is read, not its steps: one timed window, as a verdict neighbour's cold run.
    measure = json.loads((tmp_path / "warm_start" / "trial.json").read_text())["measure"]
    assert measure["windows"] == 1 and measure["precision"] == 0.0
    # Warm by inductor's own account, not by the clock: a fresh process with an empty cache builds the winner's
    # step as its trial did, loads the copied artifacts and calls the step; every graph is a cache hit.
    spec_dir = str(tmp_path / "trials" / "0000")
    counters, out = fresh_process(BUILD, [spec_dir, str(tmp_path / ARTIFACTS)], tmp_path)
    assert_compiled_warm(counters)
    assert "losses" in out and counters["frames"].get("ok", 0) >= 1  # dynamo compiled the step's frames
    assert "Warm start: compile" in warm_line(warm) and "saves" in warm_line(warm)


def test_an_eager_or_aot_eager_winner_has_nothing_to_take_home(tmp_path: Path, settings_for: Compose) -> None:
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", *FAST_MEASURE)
    assert take_home(settings, Winner(3, {}, 1.0, None), tmp_path, launch) is None
    assert not (tmp_path / ARTIFACTS).exists()
    assert "no compile artifacts" in warm_line(None)


def test_with_processes_in_flight_the_warm_start_fills_the_verdicts_first_free_flight(
        tmp_path: Path, settings_for: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    """Session 31's study ran its warm start alone for 24 s after the verdicts: now it starts, beside them, once a
    flight is free (the scheduling only: the measurement is the integration test's above)."""
    import time

    from autocompile.config.sections import Resources
    from autocompile.study.search import warmstart

    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", *FAST_MEASURE)
    measured: list[int] = []
    monkeypatch.setattr(warmstart, "warm_start", lambda study, s, winner, run_dir: measured.append(winner.number))
    monkeypatch.setattr(warmstart.EarlyWarmStart, "POLL_S", 0.02)
    running = ["verdict process", "verdict process"]
    monkeypatch.setattr(warmstart.MACHINE, "members", running)
    study = optuna.create_study()
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=1.0))
    assert warmstart.EarlyWarmStart.of(study, settings, tmp_path, [Resources()], None) is None  # one at a time
    early = warmstart.EarlyWarmStart.of(study, settings, tmp_path, [Resources()] * 2, None)
    assert early is not None
    early.start(study.trials[0])
    time.sleep(0.3)
    assert measured == []  # both flights busy
    running.pop()
    time.sleep(0.3)
    assert measured == [0]  # a flight free for two polls: measured beside the last verdict process
    early.finish()
    late = warmstart.EarlyWarmStart.of(study, settings, tmp_path, [Resources()] * 2, None)
    assert late is not None
    running.append("verdict process")
    late.start(study.trials[0])
    late.finish()
    assert measured == [0]  # the verdicts ended with every flight busy: the study's end measures it, as before
