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
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autocompile.config.knobs import KNOBS
from autocompile.report.tracking.mlflow_store import mlflow_server
from autocompile.study.records.optuna_store import counted
from autocompile.study.records.record import TrialRecord
from autocompile.trial.launcher import free_port
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
         "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "measure.windows=2",
         "measure.window_steps=2", "measure.warmup_steps=2", "compile.backend=aot_eager", "measure.max_timed_s=0.5",
         "study.confirm_top=0", "study.verdicts=none"]
# The random sampler, seeded, samples compiled trials from the start (the staged one tries eager variants first,
# and whether one of those is pruned is up to the machine's noise). Compiled autograd and nested regions are fixed
# off: with the break, they fail within the launcher's first poll as often as they are pruned there; seed 0 then
# samples a regional trial (rest eager) whose 1-2 s compile is pruned for certain: every outcome is certain.
STUDY = [*MODEL, "+model.behaviour=graph_break", "compile.fullgraph=true", "compile.compiled_autograd=false",
         "compile.granularity=block", "objective.horizon_steps=10", "study.seed=0", "study.sampler=random"]
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


@pytest.mark.integration
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

    # Every trial at any depth: the parent's children are the configurations, their other trials nested under them.
    runs = search(server, experiment["experiment_id"], f"tags.`autocompile.study` = '{study.study_name}'")
    children = [c for c in runs if c["info"]["run_id"] != parent["info"]["run_id"]]
    by_number = {int(kv(c["data"]["tags"])["optuna.trial_number"]): c for c in children}
    assert len(children) == len(by_number) == len(trials)  # one run per trial, no more
    direct = [c for c in children if kv(c["data"]["tags"])["mlflow.parentRunId"] == parent["info"]["run_id"]]
    assert len(direct) == len({t.user_attrs.get("identity", t.number) for t in study.trials})
    # near-miss prunes measured once more (study.remeasure_pruned) are trials on top of study.n_trials
    assert sum(TrialRecord.of(t).remeasure_of is None for t in study.trials) == N_TRIALS

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
            # One point per timed window: at least measure.windows, more while the mean is imprecise.
            assert len(windows["metrics"]) == trial.user_attrs["result"]["windows"] >= 2
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
    assert table[0].startswith("trial,name,state") and len(table) == 1 + len(trials)
    assert {line.split(",")[0] for line in table[1:]} == {str(n) for n in trials}
    with urllib.request.urlopen(server + "/", timeout=30) as response:  # and the UI itself is served
        assert "<html" in response.read().decode().lower()


@pytest.mark.integration
def test_resume_continues_under_the_same_parent_and_never_duplicates_a_run(study_root: Path,
                                                                          tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    root = tmp_path / "copy"
    shutil.copytree(study_root, root)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    parent_id = load_study(root).user_attrs["mlflow_parent_run_id"]

    def children() -> dict[str, Any]:  # at any depth: a configuration's other trials nest under its run
        runs = client.search_runs([client.get_run(parent_id).info.experiment_id],
                                  f"tags.`autocompile.study` = '{load_study(root).study_name}'")
        return {r.info.run_id: r for r in runs if r.info.run_id != parent_id}

    before = children()
    # A tuner killed while logging trial 1 left its child half-written (still RUNNING).
    cut = next(r for r in before.values() if r.data.tags["optuna.trial_number"] == "1")
    client.update_run(cut.info.run_id, status="RUNNING")

    # One more than the fixture counted: a near-miss prune measured once more there (timing noise) counts too.
    asked = sum(counted(t) for t in load_study(root).trials) + 1
    run = cli(*STUDY, f"study.n_trials={asked}", f"output_root={root}")
    assert run.returncode == 0, run.stderr[-3000:]
    after = children()
    numbers = sorted(int(r.data.tags["optuna.trial_number"]) for r in after.values())
    # one run per trial: the new ones added (a search trial, any near-miss it leaves), none twice
    assert numbers == list(range(len(load_study(root).trials))) and len(numbers) > len(before)
    assert set(before) - set(after) == {cut.info.run_id}  # the others untouched, the cut one replaced
    assert client.get_run(parent_id).info.status == "FINISHED"
    parents = client.search_runs([client.get_run(parent_id).info.experiment_id],
                                 f"tags.`autocompile.run_dir` = '{run_dir(study_root)}'")
    assert [p.info.run_id for p in parents] == [parent_id]  # the study's one parent, continued


@pytest.mark.integration
def test_multirun_over_http_gives_one_parent_per_job_in_one_experiment(server: str, tmp_path: Path) -> None:
    # study.reuse=off: the server holds other tests' answers for this model, whose rankings a related job measures
    # first (test_reuse.py); here each job's one trial is its eager baseline.
    run = cli("-m", *MODEL, "workload.batch_size=2,3", "study.n_trials=1", f"tracking.uri={server}",
              f"output_root={tmp_path}", "study.reuse=off")
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


UNUSABLE_STORES = [
    ("http://127.0.0.1:{port}", "is not reachable (connection refused)"),
    ("sqlite:///{tmp}/a_file/mlflow.db", "cannot be opened for writing"),
]


# A CLI subprocess per store (its imports: 10-20 s on 2 busy cores). Default run: the same checks in process,
# test_an_unusable_tracking_store_fails_in_process_in_one_line_before_any_trial; a real command line's one-line
# error: tests/test_cli.py::test_bad_input_is_one_line_naming_the_fix.
@pytest.mark.integration
@pytest.mark.parametrize(("uri", "says"), UNUSABLE_STORES)
def test_an_unusable_tracking_store_fails_in_one_line_before_any_trial(uri: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    uri = uri.format(port=free_port(), tmp=tmp_path)
    run = cli(*MODEL, "study.n_trials=1", f"tracking.uri={uri}", f"output_root={tmp_path}")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autocompile: error: tracking.uri={uri} "), run.stderr
    assert says in lines[0]
    assert not list(tmp_path.glob("*/trials"))  # no trial started


@pytest.mark.parametrize(("uri", "says"), UNUSABLE_STORES)
def test_an_unusable_tracking_store_fails_in_process_in_one_line_before_any_trial(uri: str, says: str,
                                                                                  tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    uri = uri.format(port=free_port(), tmp=tmp_path)
    code, stderr = cli_in_process(*MODEL, "study.n_trials=1", f"tracking.uri={uri}", f"output_root={tmp_path}")
    assert code != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"autocompile: error: tracking.uri={uri} "), stderr
    assert says in lines[0]
    assert not list(tmp_path.glob("*/trials"))  # no trial started


def test_plots_and_tables_cover_studies_where_nothing_completed_or_everything_did(tmp_path: Path) -> None:
    from optuna.distributions import CategoricalDistribution
    from optuna.study import StudyDirection
    from optuna.trial import create_trial

    from autocompile.report.tracking.plots import trial_rows, write_plots, write_tables
    from autocompile.study.statistics.effect import Effect

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


# -- tuners started together: one store creation, one parent run -------------------------------------

SIMULTANEOUS_CHECK = """
import sys, time
from pathlib import Path
from autocompile.report.tracking.mlflow_store import check_store
uri, barrier, me, n = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
(barrier / me).touch()
while len(list(barrier.iterdir())) < n:  # every process imported: start together
    time.sleep(0.001)
check_store(uri)
"""


@pytest.mark.integration
def test_tuners_checking_a_fresh_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    # Unlocked, their schema migrations collide: "duplicate column name: step", "table ... already exists".
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    checks = [subprocess.Popen([sys.executable, "-c", SIMULTANEOUS_CHECK, uri, str(barrier), str(i), "3"], cwd=ROOT,
                               stderr=subprocess.PIPE, text=True) for i in range(3)]
    for check in checks:
        _, err = check.communicate(timeout=300)
        assert check.returncode == 0, err[-3000:]
    from mlflow.tracking import MlflowClient

    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]


HOLDER = """
import sys, time
from pathlib import Path
from autocompile.report.tracking.mlflow_store import store_lock
uri, marker = sys.argv[1], Path(sys.argv[2])
with store_lock(uri):
    marker.write_text("held")
    while not marker.with_name("release").exists():
        time.sleep(0.01)
    marker.write_text("released")
"""


def test_the_store_lock_holds_off_another_process_until_it_lets_go(tmp_path: Path) -> None:
    from autocompile.report.tracking.mlflow_store import store_lock

    uri, marker = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "marker"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, uri, str(marker)], cwd=ROOT)
    try:
        while not marker.exists():
            assert holder.poll() is None
            time.sleep(0.01)
        seen: list[str] = []

        def take() -> None:
            with store_lock(uri):
                seen.append(marker.read_text())

        waiter = threading.Thread(target=take)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not seen  # blocked while the other process holds it
        (tmp_path / "release").touch()
        waiter.join(60)
        assert seen == ["released"]
    finally:
        (tmp_path / "release").touch()
        holder.wait(60)


def tracked_settings(tmp_path: Path) -> Any:
    from hydra import compose, initialize_config_dir

    from autocompile.app import available_models
    from autocompile.config.settings import register, settings_from

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return settings_from(compose("config", overrides=[*MODEL, f"output_root={tmp_path}"]), available_models())


def parents(client: Any, study_name: str) -> list[Any]:
    from autocompile.report.tracking.runs import STUDY_TAG

    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`{STUDY_TAG}` = '{study_name}'")
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def test_tuners_starting_a_fresh_study_together_make_one_parent_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from autocompile.report.tracking.runs import MlflowTracker
    from autocompile.study.records.optuna_store import open_study, storage_for

    settings = tracked_settings(tmp_path)
    run_dir = tmp_path / "study"
    open_study("fresh", storage_for("", run_dir), ["minimize"])
    making = MlflowTracker._experiment

    def slow_experiment(self: MlflowTracker) -> str:
        time.sleep(0.5)  # between reading the study (no parent yet) and recording the new parent
        return making(self)

    monkeypatch.setattr(MlflowTracker, "_experiment", slow_experiment)

    def start_tuner(_: int) -> MlflowTracker:  # each with its own storage object, as a process has
        return MlflowTracker(settings, optuna.load_study(study_name="fresh", storage=storage_for("", run_dir)),
                             run_dir)

    with ThreadPoolExecutor(3) as pool:
        trackers = list(pool.map(start_tuner, range(3)))
    assert len({t.parent_id for t in trackers}) == 1
    assert [r.info.run_id for r in parents(trackers[0].client, "fresh")] == [trackers[0].parent_id]


def test_parents_made_on_several_machines_merge_into_the_one_the_study_recorded(tmp_path: Path) -> None:
    from optuna.trial import create_trial

    from autocompile.report.tracking.runs import PARENT_ATTR, MlflowTracker
    from autocompile.study.records.optuna_store import open_study, storage_for

    settings = tracked_settings(tmp_path)
    study = open_study("merged", storage_for("", tmp_path / "here"), ["minimize"])
    here = MlflowTracker(settings, study, tmp_path / "here")
    # Another machine's tuner (another run directory, no shared lock) read the study before `here`
    # recorded its parent, so it made a parent of its own and recorded it last.
    study.set_user_attr(PARENT_ATTR, "")
    there = MlflowTracker(settings, study, tmp_path / "there")
    assert there.parent_id != here.parent_id
    study.add_trial(create_trial(value=1.0, user_attrs={"config": {"compile.scope": "none"}}))
    here.log_trial(study.trials[0])
    lost = here.parent_id

    here.converge()
    assert here.parent_id == there.parent_id
    client = here.client
    assert client.get_run(lost).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in parents(client, "merged")] == [there.parent_id]
    (child,) = client.search_runs([here.experiment_id], f"tags.`mlflow.parentRunId` = '{there.parent_id}'")
    assert child.data.tags["optuna.trial_number"] == "0"


def test_studies_of_one_model_started_together_share_its_experiment(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from autocompile.report.tracking.runs import MlflowTracker, experiment_name
    from autocompile.study.records.optuna_store import open_study, storage_for

    settings = tracked_settings(tmp_path)
    looking = MlflowClient.get_experiment_by_name

    def slow_lookup(self: MlflowClient, name: str) -> Any:
        found = looking(self, name)
        time.sleep(0.5)  # both studies find no experiment, then both create it
        return found

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", slow_lookup)

    def start_study(name: str) -> MlflowTracker:  # two jobs of a parallel sweep: a run directory each
        run_dir = tmp_path / name
        return MlflowTracker(settings, open_study(name, storage_for("", run_dir), ["minimize"]), run_dir)

    with ThreadPoolExecutor(2) as pool:
        trackers = list(pool.map(start_study, ["a", "b"]))
    assert trackers[0].experiment_id == trackers[1].experiment_id
    assert trackers[0].client.get_experiment(trackers[0].experiment_id).name == experiment_name(settings)
