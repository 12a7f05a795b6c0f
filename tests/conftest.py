from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import MeasureSettings, ModelSpec, TrialSpec, Workload
from autocompile.config.window_policy import WindowPolicy
from autocompile.trial.launcher import Spec, launch

ROOT = Path(__file__).resolve().parent.parent
QUICK_ROUNDS = WindowPolicy(window_steps=2, min_rounds=2, precision=0.01, max_timed_s=1.0, settle_steps=1)
"""A side-by-side process of a test: two rounds of two-step windows, a second of windows at most."""
MISSING_SERVICE = "missing service: "
"""How a test that needs a service of the machine (PostgreSQL, runuser) says it is absent: see
:func:`skip_missing_service`."""


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_missing_service(reason: str) -> None:
    """Skip a test whose service the machine lacks; on CI (``CI`` set, as ``.ci/run`` sets it) the same skip is
    made a failure by :func:`pytest_runtest_makereport`: providing the service is the setup's job."""
    pytest.skip(MISSING_SERVICE + reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On CI a skip for a missing service fails the test instead of passing silently."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and on_ci() and isinstance(report.longrepr, tuple) and MISSING_SERVICE in report.longrepr[2]:
        report.outcome = "failed"
        report.longrepr = (f"{report.longrepr[2]}\nOn CI (CI={os.environ['CI']}) a test skipped for a missing "
                           "service fails: scripts/setup.sh installs it (bash scripts/setup.sh as root).")

@pytest.fixture(autouse=True, scope="session")
def own_lease(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test process its own device lease (``autocompile.trial.lease``): the suite's parallel workers are not one
    machine's studies taking turns. A test of the machine-wide lease sets a directory its tuners share."""
    before = os.environ.get("AUTOCOMPILE_LEASE_DIR")
    os.environ["AUTOCOMPILE_LEASE_DIR"] = str(tmp_path_factory.mktemp("lease"))
    yield
    if before is None:
        os.environ.pop("AUTOCOMPILE_LEASE_DIR", None)
    else:
        os.environ["AUTOCOMPILE_LEASE_DIR"] = before


def cli_in_process(*args: str) -> tuple[int, str]:
    """``python -m autocompile ARGS`` in this process (``autocompile.app.main``): its exit code and what it wrote
    to stderr. For the one-line errors raised before anything starts: a subprocess costs seconds of imports, and
    the tests that run the real command line (tests/test_cli.py) keep one such case in the default run."""
    import contextlib
    import io
    import signal
    import sys

    from autocompile.app import main

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # main() installs its own
    argv, err = list(sys.argv), io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv[:] = argv
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code, err.getvalue()


TINY_GPT2 = ModelSpec(name="gpt2-tiny", target="autocompile.workload.models.gpt2", vocab_size=128,
                      kwargs={"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 64})


def tiny_lm(behaviour: str = "ok") -> ModelSpec:
    return ModelSpec(name=f"tiny-{behaviour}", target="tests.models.tiny_lm", vocab_size=64,
                     kwargs={"vocab_size": 64, "behaviour": behaviour})


def make_spec(knobs: dict[str, Any], *, model: ModelSpec = TINY_GPT2, nproc: int = 1, seq_len: list[int] | None = None,
              timeout_s: float = 180.0, windows: int = 2, window_steps: int = 2, device: str = "cpu") -> TrialSpec:
    workload = Workload(batch_size=2, seq_len=seq_len or [16], nproc_per_node=nproc, device=device, threads=1)
    env = Env.detect(device, nproc, workload.shapes_vary)
    config = TrialConfig.from_flat(knobs, env)  # a test must only launch valid configurations
    return TrialSpec(knobs=config.flat(), model=model, workload=workload,
                     measure=MeasureSettings(warmup_steps=2, windows=windows, window_steps=window_steps, precision=0.0,
                                             timeout_s=timeout_s),
                     device=device, threads=1)


def launched(trial_dir: Path, spec: Spec, **kwargs: Any) -> dict[str, Any]:
    """Launch one trial; what it recorded: its ``result.json`` mapping, the record the tests check key by key."""
    return launch(trial_dir, spec, **kwargs).to_json()


def run_trials(root: Path, specs: list[TrialSpec], parallel: int = 2) -> list[dict[str, Any]]:
    """Launch trials two at a time (one thread each on this 2-core machine); their records in order."""
    with ThreadPoolExecutor(parallel) as pool:
        futures = [pool.submit(launched, root / f"trial{i:03d}", spec) for i, spec in enumerate(specs)]
        return [f.result() for f in futures]


def survivors(marker: str, within_s: float = 15.0) -> list[psutil.Process]:
    """Processes whose command line names ``marker`` that are still alive after waiting up to ``within_s`` for
    them to exit: a killed tree goes away asynchronously, so the test waits on the processes, not a fixed sleep."""
    procs = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    _, alive = psutil.wait_procs(procs, timeout=within_s)
    return alive


def assert_rates(result: dict[str, Any], items_per_step: float) -> None:
    """Every timed window's throughput is exactly ``items_per_step`` (every rank's tokens or samples in one of
    the result's steps) over that window's step time, to rounding, and the headline figure is their median: a
    lost accumulation factor or a dropped rank is a factor of 2, not noise."""
    rates, steps = result["tokens_per_s_windows"], result["step_s_windows"]
    assert len(rates) == len(steps) == result["windows"] >= 1
    assert rates == pytest.approx([items_per_step / s for s in steps], rel=1e-9), (rates, items_per_step, steps)
    assert result["tokens_per_s"] == pytest.approx(statistics.median(rates), rel=1e-12)


def items_per_step(trial_dir: str | Path, unit: str) -> float:
    """What one step of the model worker processes, from the trial's own spec (not from the worker): each
    rank's batch of ``batch_size`` sequences (the mean length over the shapes, which a window runs equally
    often) or images, on every rank. A step is one micro-batch: accumulation makes windows whole optimizer
    steps, never more items per step."""
    spec = json.loads((Path(trial_dir) / "trial.json").read_text())
    workload = spec["workload"]
    ranks = workload["nproc_per_node"] * workload.get("nnodes", 1)
    per_rank = workload["batch_size"] * (statistics.fmean(workload["seq_len"]) if unit == "tokens" else 1)
    return per_rank * ranks


def assert_ok(result: dict[str, Any]) -> None:
    assert result["status"] == "ok", (result.get("failure"), result.get("reason"), result["trial_dir"])
    assert result["tokens_per_s"] > 0 and result["step_s"] > 0
    assert_rates(result, items_per_step(result["trial_dir"], result["throughput_unit"]))
    spec = json.loads((Path(result["trial_dir"]) / "trial.json").read_text())
    assert result["window_steps"] % spec["workload"]["grad_accum_steps"] == 0  # whole optimizer steps per window
    assert result["compile_s"] >= 0
    assert len(result["step_s_windows"]) >= 1
    assert all(loss == loss for loss in result["losses"])  # finite, recorded per step
    # What ran: the share of weights inside compiled graphs, and the program's fingerprint.
    assert 0.0 <= result["compiled_coverage"] <= 1.0 and result["fingerprint"]


@pytest.fixture
def cpu_env() -> Env:
    return Env.detect("cpu", 1, False)


@pytest.fixture
def settings_for() -> Iterator[Callable[..., Any]]:
    """Settings exactly as the command line would compose them (no subprocess)."""
    from hydra import compose, initialize_config_dir

    from autocompile.app import available_models
    from autocompile.config.settings import register, settings_from

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield lambda *overrides: settings_from(compose("config", overrides=list(overrides)), available_models())
