"""``script.path=train.py``: the command takes the user's script as the job (settings, identity, measure, tune)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

GPT = "examples/scripts/train_gpt.py"
SMALL = "--n_layer=2 --n_embd=32 --n_head=2 --block_size=16 --batch_size=2 --eval_interval=4 --eval_iters=1"
FAST = ["measure.warmup_steps=2", "measure.windows=2", "measure.window_steps=2", "measure.precision=0"]


def settings(*overrides: str) -> Any:
    from hydra import compose, initialize_config_dir

    from autocompile.app import available_models
    from autocompile.config.settings import register, settings_from

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return settings_from(compose("config", overrides=list(overrides)), available_models())


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # script.path is relative to where the command runs


def test_a_script_is_the_job_and_its_path_arguments_and_source_are_the_studys_identity() -> None:
    from autocompile.config.knobs import TrialConfig
    from autocompile.config.script_settings import ScriptSpec

    s = settings(f"script.path={GPT}", "script.args='--max_iters=100'")
    assert s.model.name == "train_gpt" and s.env.script_mode  # no +model needed
    assert s.study.name.startswith("train_gpt-") and s.study.name.endswith("-ws1-cpu")
    assert settings(f"script.path={GPT}", "script.args='--max_iters=200'").study.name != s.study.name
    identity = s.measured_on()
    # the seed is the study's too: the draws of an unseeded script are what its losses are compared on
    assert identity["script"] == {"path": GPT, "args": "--max_iters=100", "launcher": "auto", "seed": 0}
    assert settings(f"script.path={GPT}", "script.args='--max_iters=100'", "script.seed=null").measured_on() != identity
    assert len(identity["script_code"]) == 16
    assert "model" not in identity
    spec = s.trial_spec(TrialConfig.from_flat({"compile.scope": "regional"}, s.env))
    assert isinstance(spec, ScriptSpec) and spec.script.argv() == ["--max_iters=100"]
    assert s.study.side_by_side  # the agent switches candidates inside the script's process


@pytest.mark.parametrize(("overrides", "says"), [
    (("+model=gpt2-tiny", f"script.path={GPT}"), "both +model and script.path are given"),
    (("script.path=no_such_train.py",), "script.path='no_such_train.py' is no file"),
    ((f"script.path={GPT}", "task=measure", "amp.dtype=bfloat16"),
     "amp.dtype='bfloat16' does not apply: it needs a job autocompile runs (a script reaches it through "
     "autocompile.apply in the script"),
    (("script.args='--x=1'",), "script.args is given without script.path"),
    # Hydra's list syntax, quoted by the command line for the string field (quote_script_args): the script would get
    # one argument '[--dataset,fake]'.
    ((f"script.path={GPT}", "script.args='[--dataset,fake]'"), "is a list: give one string, split as a shell would"),
])
def test_a_script_setting_that_cannot_run_is_one_error_naming_the_fix(overrides: tuple[str, ...], says: str) -> None:
    from autocompile.config.settings import ConfigError

    with pytest.raises(ConfigError) as caught:
        settings(*overrides)
    assert says in str(caught.value)


def test_script_args_as_the_shell_hands_them_on_reach_the_script_intact() -> None:
    """``script.args='--max_iters=100 --batch_size=4'`` (the README's form): the shell drops its quotes, and a bare
    value with ``=`` or spaces is no Hydra value, so the command line quotes it for Hydra; quoted ones stay."""
    from autocompile.app import check_command_line, quote_script_args
    from autocompile.config.settings import register

    register()
    for given, args in ((["script.args=--max_iters=100 --batch_size=4"], "--max_iters=100 --batch_size=4"),
                        (["script.args=--max_iters=100"], "--max_iters=100"),
                        (["script.args=--betas=0.9,0.95"], "--betas=0.9,0.95"),  # a comma, not a sweep
                        (['script.args="--max_iters=100 --batch_size=4"'], "--max_iters=100 --batch_size=4")):
        line = [f"script.path={GPT}", *quote_script_args(given), "task=measure"]
        check_command_line(line)
        assert settings(*line[:-1]).script.args == args


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autocompile", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.integration  # the whole CLI, Hydra to the table (30 s); test_script.py runs the agent by default
def test_measure_runs_the_script_once_under_the_agent_and_prints_the_table(tmp_path: Path) -> None:
    result = cli(f"script.path={GPT}", f"script.args='{SMALL} --max_iters=20'", "task=measure",
                 "compile.scope=regional", "compile.backend=aot_eager", *FAST, f"output_root={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "transformer.h.0, transformer.h.1" in result.stdout and "tokens/s" in result.stdout
    (path,) = tmp_path.glob("train_gpt-*-ws1-cpu/measure/*/result.json")
    measured = json.loads(path.read_text())
    assert measured["status"] == "ok" and measured["compiled_coverage"] == 1.0
    assert measured["script"]["optimizer_steps"] == 6


@pytest.mark.integration
def test_tune_a_script_measures_its_eager_reference_and_searches_only_what_the_agent_reaches(tmp_path: Path) -> None:
    result = cli(f"script.path={GPT}", f"script.args='{SMALL} --max_iters=20'", "study.n_trials=4",
                 "compile.backend=eager", "study.confirm_top=0", "study.verdicts=none", "study.warm_start=false",
                 "tracking.enabled=false", *FAST, f"output_root={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.glob("train_gpt-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"] == "train_gpt" and summary["counts"]["complete"] >= 3  # eager, module, regional
    reference = json.loads((run_dir / "reference" / "result.json").read_text())
    assert reference["status"] == "ok" and len(reference["losses"]) == 6  # the script's eager run: numerics
    for trial in run_dir.glob("trials/*/trial.json"):
        knobs = json.loads(trial.read_text())["knobs"]
        assert knobs["compile.scope"] in ("none", "module", "regional")
        assert (knobs["amp.dtype"], knobs["ac.policy"], knobs["optim.impl"]) == ("none", "none", "default")


@pytest.mark.integration  # the whole CLI and one eager run (15 s)
def test_a_script_that_does_not_train_as_started_stops_the_study_at_its_eager_run(tmp_path: Path) -> None:
    """pytorch/examples' FSDP2 example on a machine without 2 GPUs prints why and exits before a step: every trial
    would end the same way. One line naming it, exit 2, no trial run, and the study's MLflow run FAILED with it."""
    import mlflow

    script = tmp_path / "needs_gpus.py"
    script.write_text('print("Unable to locate sufficient 2 gpus to run this example. Exiting.")\nexit()\n')
    store = f"sqlite:///{tmp_path}/mlflow.db"
    result = cli(f"script.path={script}", f"output_root={tmp_path / 'out'}", f"tracking.uri={store}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("autocompile: error:")]
    assert "the script does not train as started" in line and "Unable to locate sufficient 2 gpus" in line
    (run_dir,) = (tmp_path / "out").glob("needs_gpus-*")
    assert not (run_dir / "trials").exists()
    client = mlflow.MlflowClient(store)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FAILED" and "does not train" in run.data.tags["autocompile.error"]


WRITTEN_SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)  # the same weights and batches in every run: the losses are comparable with eager's
model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64))
model = torch.compile(model, fullgraph=True, dynamic=True)  # its own arguments: another program
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(400):
    ids = torch.randint(0, 64, (4, 16))
    nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1)).backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.integration  # a 4-trial study and a 2-process confirmation of a tiny script (40 s)
def test_a_script_study_measures_the_script_as_written_and_confirms_the_winner_against_it(tmp_path: Path) -> None:
    script = tmp_path / "train_written.py"
    script.write_text(WRITTEN_SCRIPT)
    result = cli(f"script.path={script}", "study.n_trials=4", "compile.backend=aot_eager", "study.confirm_top=1",
                 "compare.processes=2", "study.verdicts=none", "study.warm_start=false", "tracking.enabled=false",
                 *FAST, f"output_root={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.glob("train_written-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    written = summary["baselines"]["as_written"]
    knobs = json.loads((Path(written["trial_dir"]) / "trial.json").read_text())["knobs"]
    assert (knobs["compile.scope"], knobs["compile.fullgraph"], knobs["compile.dynamic"]) == ("module", True, True)
    assert written["number"] == 2 and "as_written" in summary["speedups"]  # after eager and compile
    # The reference run found no repeated blocks in the script's model: no regional trial, not even its baseline.
    scopes = [json.loads(t.read_text())["knobs"]["compile.scope"] for t in run_dir.glob("trials/*/trial.json")]
    assert "regional" not in scopes and "regional" not in summary["baselines"]
    confirmed = summary["confirmed"]
    assert "as_written" in [c["baseline"] for c in confirmed["candidates"]]  # timed beside the winner
    assert "as_written" in confirmed["gains"] or confirmed["winner"]["baseline"] == "as_written"
    assert "baseline as_written: the script's own torch.compile arguments" in (run_dir / "app.log").read_text()


@pytest.mark.integration  # the reference run of a tiny script, then the error (10 s)
def test_a_fixed_knob_the_scripts_model_cannot_take_is_one_error_after_its_reference_run(tmp_path: Path) -> None:
    script = tmp_path / "train_flat.py"
    script.write_text(WRITTEN_SCRIPT)  # an nn.Sequential: no repeated blocks, which only its run can tell
    result = cli(f"script.path={script}", "compile.scope=regional", "compile.backend=aot_eager", "study.n_trials=2",
                 "tracking.enabled=false", *FAST, f"output_root={tmp_path}")
    assert result.returncode != 0
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("autocompile: error:")]
    assert "compile.scope='regional' is not valid here; choose one of 'none', 'module'" in line
    assert not list(tmp_path.glob("*/trials/*"))  # no trial ran; the reference is kept
    assert list(tmp_path.glob("*/reference/result.json"))


def test_compare_takes_a_script_and_its_candidates_are_script_trials() -> None:
    from autocompile.config.script_settings import ScriptSpec

    s = settings(f"script.path={GPT}", "task=compare",
                 'compare.candidates=["compile.scope=none","compile.scope=regional compile.backend=eager"]')
    configs = s.candidate_configs()
    assert [c.compile.scope for c in configs] == ["none", "regional"]
    assert all(isinstance(s.trial_spec(c), ScriptSpec) for c in configs)


@pytest.mark.integration  # 4 launches of a script (30-60 s on 2 cores)
def test_compare_a_script_in_fresh_process_rounds_when_its_candidates_cannot_share_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested regions mark every block's forward once for every candidate: fresh-process rounds, saying why
    (candidates that can share time side by side in the script's own process: tests/test_script_sidebyside.py)."""
    from autocompile.study.compare import compare
    from tests.test_script_sidebyside import BLOCKS

    monkeypatch.chdir(tmp_path)
    (tmp_path / "blocks.py").write_text(BLOCKS)
    s = settings("script.path=blocks.py", "task=compare", "compare.processes=1", *FAST, f"output_root={tmp_path}",
                 'compare.candidates=["compile.scope=module compile.backend=eager",'
                 '"compile.scope=regional compile.granularity=nested compile.backend=eager"]')
    report = compare(s, tmp_path / "run").as_dict()  # compare.json
    assert report["method"] == "fresh_processes"
    assert "nested compile regions" in report["why"]
    assert [row["status"] for row in report["candidates"]] == ["ok", "ok"]
    assert len(report["pairs"]) == 1 and report["pairs"][0]["step"]["basis"] == "fresh-process rounds"
    rounds = sorted(p.parent.name for p in (tmp_path / "run" / "compare").glob("*/round0/*/result.json"))
    assert rounds == ["0", "1"]  # each candidate its own process in the round
