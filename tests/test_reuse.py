"""Issue 52: a study's answer is kept where the team looks (its run directory, its MLflow parent run) and a later
study of the same job starts from it: an exact one re-verified side by side, a related one's ranking measured first;
a corrupt record or an unreachable store is a warning and a full study."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autocompile.config.gpus import device_name
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace, identity
from autocompile.report.watch import reuse_line
from autocompile.study.answers import (
    ANSWER_TAG,
    Answer,
    answer_key,
    differences,
    find_in_store,
    keep,
    numerics_key,
    read_file,
)
from autocompile.study.phases.confirmation import INCUMBENT
from autocompile.study.phases.racing import alone_noise
from autocompile.study.records.compile_prior import MAX_LEARNED_DF, prior_for, record_prior, study_prior
from autocompile.study.reuse import REUSED, config_of, known_answer, reference_from, start_from
from autocompile.study.search.numerics import reference, reference_peak
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent
Compose = Callable[..., Settings]
GPT2 = ("+model=gpt2-tiny", "workload.device=cpu")


def answer_for(settings: Settings, winner: dict, decided: bool = True, priors: dict | None = None) -> Answer:
    key = answer_key(settings)
    return Answer(key.exact, key.related, key.fields, "earlier", "2026-11-29T00:00:00Z", winner,
                  ", ".join(f"{k}={v}" for k, v in winner.items()), decided,
                  ranking=[winner, *({"compile.scope": scope} for scope in ("regional", "none", "module"))],
                  priors=priors or {}, numerics_key=numerics_key(settings))


def test_an_answers_key_is_the_job_and_its_related_key_the_model_on_the_device(settings_for: Compose) -> None:
    base = answer_key(settings_for(*GPT2))
    assert answer_key(settings_for(*GPT2)) == base  # the same job: the same key, every time
    other_batch = answer_key(settings_for(*GPT2, "workload.batch_size=4"))
    assert other_batch.exact != base.exact and other_batch.related == base.related
    assert [k for k in base.fields if base.fields[k] != other_batch.fields[k]] == ["workload"]
    other_objective = answer_key(settings_for(*GPT2, "objective.horizon_steps=500"))
    assert other_objective.exact != base.exact and other_objective.related == base.related
    other_model = answer_key(settings_for("+model=llama-tiny", "workload.device=cpu"))
    assert other_model.related != base.related
    # A record made on another torch: never exact, and the report says what differs.
    older = answer_for(settings_for(*GPT2), {"compile.scope": "train_step"})
    older = dataclasses.replace(older, fields={**older.fields, "torch": "2.11.0"})
    assert differences(older, base) == ["torch"]


def test_a_finished_studys_answer_is_found_by_its_key_in_the_tracking_store(settings_for: Compose,
                                                                           tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from autocompile.report.tracking.child_run import answer_tags

    settings = settings_for(*GPT2)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("autocompile-test")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    keep(answer_for(settings, {"compile.scope": "train_step"}), run_dir)
    assert read_file(run_dir / "answer.json").winner == {"compile.scope": "train_step"}
    run = client.create_run(experiment, tags=dict(answer_tags(run_dir)))
    found = find_in_store(uri, answer_key(settings))
    assert found is not None and found.winner == {"compile.scope": "train_step"}
    assert found.source == f"mlflow run {run.info.run_id}"
    # Another batch size finds it as related (its key differs), and says so.
    bigger = answer_key(settings_for(*GPT2, "workload.batch_size=4"))
    related = find_in_store(uri, bigger)
    assert related is not None and related.key != bigger.exact and differences(related, bigger) == ["workload"]
    assert find_in_store(uri, answer_key(settings_for("+model=llama-tiny", "workload.device=cpu"))) is None


def test_a_corrupt_record_or_an_unreachable_store_is_a_warning_and_no_answer(
        settings_for: Compose, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    settings = settings_for(*GPT2)
    key = answer_key(settings)
    half = tmp_path / "answer.json"
    half.write_text(answer_for(settings, {"compile.scope": "module"}).to_json()[:40])  # cut off while written
    with caplog.at_level(logging.WARNING):
        assert read_file(half) is None
    assert "not an answer autocompile can read" in caplog.text
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("autocompile-test")
    client.create_run(experiment, tags={"autocompile.answer_key": key.exact, ANSWER_TAG: "{not json"})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert find_in_store(uri, key) is None
    assert "its answer cannot be read" in caplog.text
    # Two tuners of one study finishing at once each write the run directory's answer: every read sees a whole one.
    import threading

    answers = [answer_for(settings, {"compile.scope": scope}) for scope in ("module", "train_step")]
    stop = threading.Event()

    def write(answer: Answer) -> None:
        while not stop.is_set():
            keep(answer, tmp_path)

    keep(answers[0], tmp_path)  # the half-written file above replaced: from here on every read must be whole
    writers = [threading.Thread(target=write, args=(a,)) for a in answers]
    for w in writers:
        w.start()
    try:
        seen = {read_file(tmp_path / "answer.json").winner["compile.scope"] for _ in range(200)}
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert seen <= {"module", "train_step"} and seen
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert find_in_store(f"http://127.0.0.1:{port}", key) is None
    assert "cannot be searched" in caplog.text and "the study runs in full" in caplog.text


def start(study: optuna.Study, space: SearchSpace, settings: Settings) -> Settings:
    """What the tuner does: look the answer up once, then start from it."""
    key = answer_key(settings)
    return start_from(study, space, settings, key, known_answer(study, settings, key))


def test_an_exact_answer_lends_its_numerics_reference_and_a_related_one_does_not(settings_for: Compose,
                                                                                  tmp_path: Path) -> None:
    settings = settings_for(*GPT2, f"output_root={tmp_path}")
    measured = {"status": "ok", "basis": "eager fp32", "losses": [4.2, 4.1, 4.0], "step_s": 0.02, "peak_bytes": 2e8}
    keep(dataclasses.replace(answer_for(settings, {"compile.scope": "train_step"}), reference=measured), tmp_path)
    exact = settings_for(*GPT2, f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    key = answer_key(exact)
    assert reference_from(study, known_answer(study, exact, key), key, exact)
    ref = reference(study)
    assert ref is not None and ref["losses"] == measured["losses"] and ref["reused_from"].startswith("study ")
    assert reference_peak(ref) == 2e8  # the processes in flight are sized from it, with no result.json here
    bigger = settings_for(*GPT2, "workload.batch_size=4", f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    key = answer_key(bigger)
    assert not reference_from(study, known_answer(study, bigger, key), key, bigger) and reference(study) is None
    # Another seed: the same answer (the ranking stands), other losses (no reference lent).
    seeded = settings_for(*GPT2, "workload.seed=1", f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    key = answer_key(seeded)
    answer = known_answer(study, seeded, key)
    assert answer is not None and answer.key == key.exact and not reference_from(study, answer, key, seeded)
    keep(dataclasses.replace(answer_for(settings, {"compile.scope": "train_step"}),
                             reference={"status": "failed", "reason": "oom"}), tmp_path)
    study = optuna.create_study()
    key = answer_key(exact)
    assert not reference_from(study, known_answer(study, exact, key), key, exact)  # none to take: measured here
    # An answer written with a long run's losses drops them to fit an MLflow tag, never the answer.
    long = dataclasses.replace(answer_for(settings, {"compile.scope": "train_step"}),
                               reference={**measured, "losses": [1.0] * 2000})
    fitted = json.loads(long.to_json(limit=5000))
    assert fitted["reference"] == {} and len(long.to_json()) > 5000 and fitted["ranking"] == long.ranking


def test_an_exact_answer_is_reverified_and_a_related_one_orders_the_search(settings_for: Compose,
                                                                         tmp_path: Path) -> None:
    settings = settings_for(*GPT2, f"output_root={tmp_path}")
    space = SearchSpace(settings.env, settings.fixed_knobs)
    keep(answer_for(settings, {"compile.scope": "train_step"}), tmp_path)
    exact = dataclasses.replace(settings, study=dataclasses.replace(settings.study,
                                                                    reuse_from=str(tmp_path / "answer.json")))
    study = optuna.create_study()
    runs = start(study, space, exact)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    # The winner, then the baselines it must beat; only those, raced side by side in 3 processes, nothing after.
    assert [t.user_attrs.get("baseline") for t in waiting] == [None, "eager", "compile"]
    assert runs.study.n_trials == 3 and runs.study.confirm_top == 3 and runs.compare.decided_processes == 3
    assert runs.study.verdicts == "none" and not runs.study.warm_start and not runs.study.baselines
    assert study.user_attrs[REUSED]["exact"] and study.user_attrs[REUSED]["source"].startswith("file ")
    # The race keeps the known winner unless a candidate is measurably faster (test_racing.py).
    assert study.user_attrs[INCUMBENT] == identity(config_of(space, {"compile.scope": "train_step"}), settings.env)
    # Resumed: the same re-verification, nothing queued twice.
    again = start(study, space, exact)
    assert again.study.n_trials == 3 and len(study.get_trials(states=(TrialState.WAITING,))) == 3
    # Another batch size: related; its ranking's best three are measured first, then the study runs in full.
    bigger = settings_for(*GPT2, "workload.batch_size=4", f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    runs = start(study, SearchSpace(bigger.env, bigger.fixed_knobs), bigger)
    assert runs is bigger and len(study.get_trials(states=(TrialState.WAITING,))) == 3
    # One that is a baseline is queued as it (the study's queue_baselines then finds it there).
    assert [t.user_attrs.get("baseline") for t in study.get_trials(states=(TrialState.WAITING,))] == [
        None, "regional", "eager"]
    assert study.user_attrs[REUSED]["differs"] == ["workload"] and not study.user_attrs[REUSED]["exact"]
    # The same job recorded on another torch: related too, never exact (nor its numerics reference taken).
    older = answer_for(settings, {"compile.scope": "train_step"})
    keep(dataclasses.replace(older, key="made-on-2.11", fields={**older.fields, "torch": "2.11.0"},
                             reference={"status": "ok", "losses": [4.0]}), tmp_path)
    study = optuna.create_study()
    runs = start(study, space, exact)
    assert runs is exact and len(study.get_trials(states=(TrialState.WAITING,))) == 3
    assert study.user_attrs[REUSED]["differs"] == ["torch"] and not study.user_attrs[REUSED]["exact"]
    assert not reference_from(optuna.create_study(), read_file(tmp_path / "answer.json"), answer_key(settings),
                              settings)
    # A winner its study left undetermined against a rival: that rival is raced again too, and said so.
    undecided = dataclasses.replace(answer_for(settings, {"compile.scope": "train_step"}, decided=False),
                                    contenders=[{"compile.scope": "regional"}])
    keep(undecided, tmp_path)
    study = optuna.create_study()
    assert start(study, space, exact).study.n_trials == 4
    assert study.user_attrs[REUSED]["exact"] and not study.user_attrs[REUSED]["decided"]
    assert study.user_attrs[REUSED]["contenders"] == 1
    assert [t.system_attrs["fixed_params"].get("compile.scope") for t in
            study.get_trials(states=(TrialState.WAITING,))][:2] == ["train_step", "regional"]
    assert "the 1 rival(s) its study could not rule out" in reuse_line(study)
    off = settings_for(*GPT2, "study.reuse=off", f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    assert start(study, space, off) is off and not study.trials


def test_a_related_answer_lends_its_measured_noise_as_the_studys_priors(settings_for: Compose,
                                                                        tmp_path: Path) -> None:
    settings = settings_for(*GPT2, f"output_root={tmp_path}")
    measured = {"device": device_name("cpu"), "compile_cv": 0.05, "compile_df": 20, "alone_noise": 0.031,
                "alone_df": 6}
    keep(answer_for(settings, {"compile.scope": "train_step"}, priors=measured), tmp_path)
    bigger = settings_for(*GPT2, "workload.batch_size=4", f"study.reuse_from={tmp_path / 'answer.json'}")
    study = optuna.create_study()
    record_prior(study, prior_for(bigger))  # as open_for does before start_from
    assert alone_noise(study) is None  # nothing measured: the rules' own prior
    start(study, SearchSpace(bigger.env, bigger.fixed_knobs), bigger)
    # Its compile spread (20 df, at most 12 taken) outweighs the class's 8 df: it speaks alone.
    prior = study_prior(study, bigger.objective)
    assert prior.cv == pytest.approx(0.05) and prior.df == MAX_LEARNED_DF and "related study earlier" in prior.source
    assert alone_noise(study) == pytest.approx(0.031)
    assert study.user_attrs[REUSED]["priors"] == ["compile spread 5.0% on 12 df", "process noise 3.1%"]
    # Measured on another device: nothing taken. objective.compile_cv given: the user's spread stands.
    for other, overrides in (({**measured, "device": "elsewhere"}, ()), (measured, ("objective.compile_cv=0.2",))):
        keep(answer_for(settings, {"compile.scope": "train_step"}, priors=other), tmp_path)
        related = settings_for(*GPT2, "workload.batch_size=4", f"study.reuse_from={tmp_path / 'answer.json'}",
                               *overrides)
        study = optuna.create_study()
        record_prior(study, prior_for(related))
        start(study, SearchSpace(related.env, related.fixed_knobs), related)
        assert "related" not in study_prior(study, related.objective).source
        assert (alone_noise(study) is None) == (other["device"] == "elsewhere")


def test_bad_reuse_settings_fail_in_one_line(tmp_path: Path) -> None:
    for arg, said in (("study.reuse=maybe", "study.reuse='maybe': choose auto or off"),
                      (f"study.reuse_from={tmp_path / 'none.json'}", "no such file")):
        code, err = cli_in_process("+model=gpt2-tiny", arg, f"output_root={tmp_path}")
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing made


TINY = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
        "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "measure.windows=2",
        "measure.window_steps=2", "measure.warmup_steps=2", "measure.max_timed_s=0.5", "compile.backend=aot_eager",
        "+workload.optimizer.foreach=false", "study.n_trials=5", "study.confirm_top=2", "study.verdicts=none",
        "compare.processes=3"]


def study_of(root: Path) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    (journal,) = root.glob("*/optuna.journal")
    storage = JournalStorage(JournalFileBackend(str(journal)))
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def tune(root: Path, uri: str, *args: str) -> tuple[optuna.Study, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autocompile", *TINY, f"output_root={root}", f"tracking.uri={uri}",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return study_of(root), done.stdout + done.stderr, time.monotonic() - started


def recommended_config(root: Path) -> dict:
    import json

    (summary,) = root.glob("*/summary.json")
    return json.loads(summary.read_text())["recommended"]["config"]


@pytest.mark.integration
def test_a_second_run_root_on_one_mlflow_server_reverifies_the_first_ones_answer(tmp_path: Path) -> None:
    """Two run roots on one ``mlflow server`` process (a real server, started here): the second root's study finds
    the first's answer by key and re-verifies it side by side; ``study.reuse=off`` runs the full study."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                               "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        uri = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        first, _, _ = tune(tmp_path / "first", uri)
        assert REUSED not in first.user_attrs and (next((tmp_path / "first").glob("*/answer.json"))).is_file()
        second, said, _ = tune(tmp_path / "second", uri)
        assert second.user_attrs[REUSED]["exact"] and second.user_attrs[REUSED]["source"].startswith("mlflow run ")
        assert "Reused the answer of study" in said and "re-verified" in said
        # Its brief runs (one window each) claim no interval; the warm start is the first study's, not "none".
        assert "± 0.00" not in said and "Warm start: not measured (a re-verification" in said
        # Its numerics reference is the first study's (the same job, seed and all): no eager reference process ran.
        assert second.user_attrs["reference"]["reused_from"].startswith("study ")
        assert not list((tmp_path / "second").glob("*/reference"))
        search = [t for t in second.trials if t.user_attrs.get("phase") == "search"]
        assert len(search) <= 3 < len([t for t in first.trials if t.user_attrs.get("phase") == "search"])
        assert any(t.user_attrs.get("phase") == "confirm" and t.user_attrs.get("method") == "side_by_side"
                   for t in second.trials)
        # Which of them leads today is the machine's to say (a near tie can flip): the known winner was raced again,
        # and the recommendation is one of the configurations the re-verification raced.
        raced = [t.user_attrs["config"] for t in second.trials if t.user_attrs.get("phase") == "search"]
        assert recommended_config(tmp_path / "first") in raced and recommended_config(tmp_path / "second") in raced
        full, _, _ = tune(tmp_path / "third", uri, "study.reuse=off")
        assert REUSED not in full.user_attrs
        assert len([t for t in full.trials if t.user_attrs.get("phase") == "search"]) >= len(search) + 2
        # Another batch size: a related answer; its search measures the known ranking's best first, then in full.
        related, said, _ = tune(tmp_path / "fourth", uri, "workload.batch_size=4")
        assert not related.user_attrs[REUSED]["exact"] and related.user_attrs[REUSED]["differs"] == ["workload"]
        assert "a related answer" in said
        known = [{k: v for k, v in t.user_attrs["config"].items()} for t in sorted(
            (t for t in first.trials if t.user_attrs.get("phase") == "search" and t.state == TrialState.COMPLETE),
            key=lambda t: t.values[0])]
        firsts = [t.user_attrs["config"] for t in related.trials[:related.user_attrs[REUSED]["queued"]]]
        assert firsts and all(config in known for config in firsts)
        assert len([t for t in related.trials if t.user_attrs.get("phase") == "search"]) >= 5
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_answers_a_store_knows_are_listed(settings_for: Compose, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.tracking import MlflowClient

    from autocompile.report.tracking.child_run import answer_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def listed() -> tuple[int, str]:
        code, _ = cli_in_process("task=answers", f"tracking.uri={uri}")
        return code, capsys.readouterr().out

    code, out = listed()
    assert code == 1 and "no answers in" in out
    client = MlflowClient(tracking_uri=uri)
    keep(answer_for(settings_for(*GPT2), {"compile.scope": "train_step"}), tmp_path)
    run = client.create_run(client.create_experiment("autocompile-test"), tags=dict(answer_tags(tmp_path)))
    code, out = listed()
    assert code == 0 and "earlier" in out and "compile.scope=train_step" in out and run.info.run_id in out
