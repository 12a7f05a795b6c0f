"""MLflow: a real small study lands in the store in the shape the UI's compare views use.

One study is shared by the module (a tiny model whose forward has a graph break, fullgraph fixed:
the compile baseline fails with the break's reason; compile time alone cannot pay back over a
10-step horizon, so sampled compiled trials are pruned). An ``mlflow server`` on 127.0.0.1 serves
its store and every check goes through the REST API, as the UI's would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autocompile.knobs import KNOBS
from autocompile.launcher import free_port
from autocompile.tracking import mlflow_server

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
         "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "measure.windows=2",
         "measure.window_steps=2", "measure.warmup_steps=2", "compile.backend=aot_eager", "measure.max_timed_s=0.5",
         "study.confirm_top=0", "study.verdicts=none"]
STUDY = [*MODEL, "+model.behaviour=graph_break", "compile.fullgraph=true", "objective.horizon_steps=10",
         "study.seed=0"]
N_TRIALS = 6
EXPERIMENT = "autocompile/tiny_lm"
STATES = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autocompile", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def run_dir(root: Path) -> Path:
    (journal,) = root.glob("*/optuna.journal")
    return journal.parent.resolve()


def load_study(root: Path) -> optuna.Study:
    (journal,) = root.glob("*/optuna.journal")
    storage = JournalStorage(JournalFileBackend(str(journal)))
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


@pytest.fixture(scope="module")
def study_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tracked")
    run = cli(*STUDY, f"study.n_trials={N_TRIALS}", f"output_root={root}")
    assert run.returncode == 0, run.stderr[-3000:]
    states = {t.state for t in load_study(root).trials}
    # The study must show every outcome, or the checks below would prove nothing about failures.
    assert {TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED} <= states, states
    return root


@pytest.fixture(scope="module")
def server(study_root: Path) -> Iterator[str]:
    with mlflow_server(f"sqlite:///{study_root / 'mlflow.db'}", study_root / "mlflow-server.log") as url:
        yield url


def api(server: str, endpoint: str, body: dict[str, Any] | None = None, **query: Any) -> Any:
    url = f"{server}/api/2.0/mlflow/{endpoint}" + ("?" + urllib.parse.urlencode(query) if query else "")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def search(server: str, experiment_id: str, filter_string: str) -> list[dict[str, Any]]:
    return api(server, "runs/search", {"experiment_ids": [experiment_id], "filter": filter_string,
                                       "max_results": 1000}).get("runs", [])


def kv(items: list[dict[str, str]] | None) -> dict[str, str]:
    return {i["key"]: i["value"] for i in items or []}


def test_every_trial_is_a_child_run_with_knobs_metrics_histories_and_reasons(study_root: Path, server: str) -> None:
    study = load_study(study_root)
    trials = {t.number: t for t in study.trials}
    experiment = api(server, "experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    assert experiment["artifact_location"].startswith((study_root / "mlartifacts").as_uri())  # not ./mlruns

    (parent,) = search(server, experiment["experiment_id"], f"tags.`autocompile.run_dir` = '{run_dir(study_root)}'")
    assert parent["info"]["run_name"] == study.study_name and parent["info"]["status"] == "FINISHED"
    assert study.user_attrs["mlflow_parent_run_id"] == parent["info"]["run_id"]
    parent_tags = kv(parent["data"].get("tags"))
    assert parent_tags["best_run_id"] and "Best: trial" in parent_tags["mlflow.note.content"]

    children = search(server, experiment["experiment_id"], f"tags.`mlflow.parentRunId` = '{parent['info']['run_id']}'")
    by_number = {int(kv(c["data"]["tags"])["optuna.trial_number"]): c for c in children}
    assert len(children) == len(by_number) == len(trials) == N_TRIALS  # one child per trial, no more

    for number, child in by_number.items():
        trial = trials[number]
        info, params, tags = child["info"], kv(child["data"].get("params")), kv(child["data"]["tags"])
        metrics = kv(child["data"].get("metrics"))
        assert info["run_name"].startswith(f"#{number} ")
        assert "compile.backend" not in info["run_name"]  # fixed for the whole study: names show what differs
        assert set(KNOBS) <= set(params)  # every knob, under its config key, in every run: shared axes
        assert params["compile.scope"] == trial.user_attrs["config"]["compile.scope"]
        assert params["workload.batch_size"] == "2" and params["workload.seq_len"] == "16"
        assert tags["optuna.state"] == trial.state.name and info["status"] == STATES[trial.state.name]
        assert tags["torch"].startswith("2.") and tags["device_name"] and tags["world_size"] == "1"
        if trial.state == TrialState.COMPLETE:
            for key in ("tokens_per_s", "step_s", "compile_s", "objective", "peak_memory_mb", "graph_count",
                        "graph_breaks", "recompiles_timed", "step_s_cv", "time_to_train_s"):
                assert key in metrics, (number, key)
            # Baselines measured after this trial still give it a speedup (filled in at the end).
            assert {"speedup_vs_eager", "speedup_vs_regional"} <= set(metrics), (number, sorted(metrics))
            assert float(metrics["objective"]) == pytest.approx(trial.value)
            loss = api(server, "metrics/get-history", run_id=info["run_id"], metric_key="loss")["metrics"]
            assert sorted(m["step"] for m in loss) == list(range(len(trial.user_attrs["result"]["losses"])))
            windows = api(server, "metrics/get-history", run_id=info["run_id"], metric_key="tokens_per_s_window")
            assert len(windows["metrics"]) == 2
        else:
            reason = trial.user_attrs["reason"]
            assert reason and tags["reason"] == reason[:5000] and reason[:50] in tags["mlflow.note.content"]
        if trial.user_attrs.get("baseline") == "eager":
            assert float(metrics["speedup_vs_eager"]) == pytest.approx(1.0)
        if "duplicate_of" not in trial.user_attrs:
            files = {f["path"] for f in api(server, "artifacts/list", run_id=info["run_id"], path="trial")["files"]}
            assert {"trial/trial.json", "trial/result.json", "trial/cmd.txt", "trial/stderr.log"} <= files

    failed = [c for n, c in by_number.items() if trials[n].state == TrialState.FAIL]
    assert any("graph" in kv(c["data"]["tags"])["reason"].lower() for c in failed)
    assert by_number[0]["info"]["run_name"] == "#0 eager baseline"

    parent_files = {f["path"] for f in api(server, "artifacts/list", run_id=parent["info"]["run_id"])["files"]}
    assert {"config.yaml", "summary.json", "best_config.yaml", "best_config.py", "plots", "tables"} <= parent_files
    plots = {f["path"] for f in api(server, "artifacts/list", run_id=parent["info"]["run_id"], path="plots")["files"]}
    assert {"plots/pareto.png", "plots/knob_effects.png", "plots/history.png", "plots/plots.html"} <= plots
    # The server hands the files to the UI: the trials table lists every trial with its state.
    with urllib.request.urlopen(f"{server}/get-artifact?" + urllib.parse.urlencode(
            {"path": "tables/trials.csv", "run_uuid": parent["info"]["run_id"]}), timeout=30) as response:
        table = response.read().decode().splitlines()
    assert table[0].startswith("trial,name,state") and len(table) == 1 + N_TRIALS
    assert {line.split(",")[0] for line in table[1:]} == {str(n) for n in trials}
    with urllib.request.urlopen(server + "/", timeout=30) as response:  # and the UI itself is served
        assert "<html" in response.read().decode().lower()


def test_resume_continues_under_the_same_parent_and_never_duplicates_a_run(study_root: Path,
                                                                          tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    root = tmp_path / "copy"
    shutil.copytree(study_root, root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    parent_id = load_study(root).user_attrs["mlflow_parent_run_id"]

    def children() -> dict[str, Any]:
        return {r.info.run_id: r for r in client.search_runs(
            [client.get_run(parent_id).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")}

    before = children()
    # A tuner killed while logging trial 1 left its child half-written (still RUNNING).
    cut = next(r for r in before.values() if r.data.tags["optuna.trial_number"] == "1")
    client.update_run(cut.info.run_id, status="RUNNING")

    run = cli(*STUDY, f"study.n_trials={N_TRIALS + 1}", f"output_root={root}")
    assert run.returncode == 0, run.stderr[-3000:]
    after = children()
    numbers = sorted(int(r.data.tags["optuna.trial_number"]) for r in after.values())
    assert numbers == list(range(N_TRIALS + 1))  # one run per trial: the new one added, none twice
    assert set(before) - set(after) == {cut.info.run_id}  # the others untouched, the cut one replaced
    assert client.get_run(parent_id).info.status == "FINISHED"
    parents = client.search_runs([client.get_run(parent_id).info.experiment_id],
                                 f"tags.`autocompile.run_dir` = '{run_dir(study_root)}'")
    assert [p.info.run_id for p in parents] == [parent_id]  # the study's one parent, continued


def test_multirun_over_http_gives_one_parent_per_job_in_one_experiment(server: str, tmp_path: Path) -> None:
    run = cli("-m", *MODEL, "workload.batch_size=2,3", "study.n_trials=1", f"tracking.uri={server}",
              f"output_root={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "not logged" not in run.stdout + run.stderr  # every write went through the server
    experiment = api(server, "experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    parents = search(server, experiment["experiment_id"], f"tags.`autocompile.run_dir` LIKE '{tmp_path.resolve()}/%'")
    assert sorted(p["info"]["run_name"] for p in parents) == [
        "tiny_lm-bs2-seq16-ws1-cpu+compile.backend=aot_eager", "tiny_lm-bs3-seq16-ws1-cpu+compile.backend=aot_eager"]
    for parent in parents:
        parent_id = parent["info"]["run_id"]
        (child,) = search(server, experiment["experiment_id"], f"tags.`mlflow.parentRunId` = '{parent_id}'")
        assert child["info"]["run_name"] == "#0 eager baseline" and child["info"]["status"] == "FINISHED"
        assert kv(child["data"]["params"])["workload.batch_size"] == kv(parent["data"]["params"])["workload.batch_size"]
        assert "tokens_per_s" in kv(child["data"]["metrics"])


@pytest.mark.parametrize(("uri", "says"), [
    ("http://127.0.0.1:{port}", "is not reachable (connection refused)"),
    ("sqlite:///{tmp}/a_file/mlflow.db", "cannot be opened for writing"),
])
def test_an_unusable_tracking_store_fails_in_one_line_before_any_trial(uri: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    uri = uri.format(port=free_port(), tmp=tmp_path)
    run = cli(*MODEL, "study.n_trials=1", f"tracking.uri={uri}", f"output_root={tmp_path}")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autocompile: error: tracking.uri={uri} "), run.stderr
    assert says in lines[0]
    assert not list(tmp_path.glob("*/trials"))  # no trial started


def test_plots_and_tables_cover_studies_where_nothing_completed_or_everything_did(tmp_path: Path) -> None:
    from optuna.distributions import CategoricalDistribution
    from optuna.study import StudyDirection
    from optuna.trial import create_trial

    from autocompile.effects import Effect
    from autocompile.plots import trial_rows, write_plots, write_tables

    def result(step_s: float, compile_s: float) -> dict[str, Any]:
        return {"status": "ok", "tokens_per_s": 32 / step_s, "step_s": step_s, "step_s_cv": 0.01,
                "compile_s": compile_s, "peak_memory_bytes": 2**20, "graph_breaks": 0, "recompiles_timed": 0}

    scope = {"compile.scope": CategoricalDistribution(["none", "module"])}
    failed = [create_trial(state=TrialState.FAIL, params={"compile.scope": "module"}, distributions=scope,
                           user_attrs={"name": "compile.scope=module", "reason": "graph break | in forward"}),
              create_trial(state=TrialState.PRUNED, user_attrs={"reason": "compile alone too slow"})]
    done = [create_trial(values=[3.0, 0.0], user_attrs={"result": result(0.01, 0.0), "baseline": "eager"}),
            create_trial(values=[4.0, 2.0], user_attrs={"result": result(0.008, 2.0)})]
    for number, trial in enumerate(failed + done):
        trial.number = number
    effect = Effect("compile.scope", "Compile?", "none", "module", -0.2, 0.01, 2.0, 1, True)
    for name, trials, effects, directions in (
            ("none", failed, [], [StudyDirection.MINIMIZE]),
            ("all", failed + done, [effect], [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE])):
        rows = trial_rows(trials, horizon_steps=100)
        out = tmp_path / name
        written = write_tables(rows, effects, out) + write_plots(rows, [2, 3], effects, directions, "pareto", out)
        assert all(p.stat().st_size > 0 for p in written)
        assert {p.name for p in written} >= {"pareto.png", "knob_effects.png", "history.png", "plots.html"}
        table = (out / "trials.md").read_text()
        assert "graph break \\| in forward" in table and "compile alone too slow" in table  # reasons, escaped
    assert "module vs none: steps 20.0% faster" in (tmp_path / "all" / "knob_verdicts.md").read_text()
    assert "Plotly.newPlot" in (tmp_path / "all" / "plots.html").read_text()
