"""The first minutes of a study as a user sees them: the estimate before the search, the progress of
every long wait, and a closing message that matches how the study ended (normal, all failed,
interrupted before any result)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autocompile.report.view import progress_text
from autocompile.trial.launcher import read_progress
from tests.test_interrupt import in_windows
from tests.test_tuner import ROOT, TINY, load, tune_cli


@pytest.mark.integration
def test_a_normal_study_says_its_cost_first_then_what_it_measured(tmp_path: Path) -> None:
    run = tune_cli(tmp_path, "compile.scope=none", "study.n_trials=3", "study.seed=1")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    # Said before the first trial starts, from the reference's measured wall time.
    estimate = out.index("estimate: about")
    assert estimate < out.index(" trials in ")
    assert "search ~" in out[estimate:]
    assert "study.n_trials, study.verdicts and measure.max_timed_s trade it down" in out
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    counts = summary["counts"]
    # near-miss prunes measured once more (study.remeasure_pruned) come on top of study.n_trials
    assert counts["trials"] - counts["remeasured"] == 3 and counts["queued"] == 0 and counts["interrupted"] == 0
    assert counts["measured"] >= 1 and summary["best"] is not None
    assert f"{counts['trials']} trials in" in out and "Best" in out and "nothing measured yet" not in out

    # Every trial's progress events read as the phases a user waits through, in order.
    (trial_dir,) = [p for p in tmp_path.glob("*/trials/*") if (p / "progress.jsonl").is_file()][:1]
    events = read_progress(trial_dir)
    seen = [progress_text(events[:i], 1.0).split(":")[0].split(",")[0] for i in range(len(events) + 1)]
    assert seen[0] == "starting" and seen[1] == "building the model"
    assert "warm-up (compile)" in seen and "timing" in seen
    assert seen.index("warm-up (compile)") < seen.index("timing")
    assert progress_text(events[:-1], 3.0).startswith("timing: window")


@pytest.mark.integration
def test_a_study_whose_trials_all_fail_says_why_grouped(tmp_path: Path) -> None:
    run = tune_cli(tmp_path, "+model.behaviour=raise", "compile.backend=eager", "study.baselines=false",
                   "study.n_trials=3")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    counts, groups = summary["counts"], summary["failures"]
    assert summary["best"] is None and counts["measured"] == counts["failed"] >= 1
    # Every measured trial is in one group, each group has its reason (the model's error, or dynamo's
    # word for it under fullgraph) and is printed with its count.
    assert sorted(n for g in groups for n in g["trials"]) == sorted(set(n for g in groups for n in g["trials"]))
    assert sum(len(g["trials"]) for g in groups) == counts["measured"]
    assert all(any(why in g["reason"] for why in ("boom from the test model", "Observed exception")) for g in groups)
    assert f"No feasible result: nothing to recommend. What ended the {counts['measured']} measured trial(s):" \
        in run.stdout
    for g in groups:
        assert f"{len(g['trials'])} x {g['outcome']}: {g['reason'][:40]}" in run.stdout
    assert "Failure reasons are in the trial table" not in run.stdout


@pytest.mark.integration
def test_a_study_interrupted_before_any_result_says_nothing_was_measured_and_how_to_resume(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "autocompile", *TINY, f"output_root={tmp_path}", "+model.block_sleep_s=0.05",
            "compile.scope=none", "measure.windows=50", "study.n_trials=4", "study.prune=false",
            "launch.concurrency=1"]  # one trial running when interrupted
    with open(tmp_path / "tuner.log", "wb") as out:
        tuner = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and in_windows(tmp_path) < 1 and tuner.poll() is None:
                time.sleep(0.2)
            assert in_windows(tmp_path) == 1, (tmp_path / "tuner.log").read_text()[-3000:]
            tuner.send_signal(signal.SIGINT)
            returncode = tuner.wait(timeout=60)
        finally:
            if tuner.poll() is None:
                tuner.kill()
    log = " ".join((tmp_path / "tuner.log").read_text().split())  # as one line: the console wraps at its width
    assert returncode == 130, log[-3000:]
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    counts = summary["counts"]
    # The queued baseline is not a trial that ran: 0 finished, 1 interrupted, the rest queued.
    assert counts["trials"] == 0 and counts["measured"] == 0 and counts["interrupted"] == 1
    assert counts["queued"] >= 1
    assert "0 trials in" in log and "1 interrupted (measured nothing, queued again)" in log
    assert f"{counts['queued']} queued and never started" in log
    assert ("Interrupted before any trial finished: nothing measured yet; rerun the same command to resume "
            f"({counts['queued']} configuration(s) queued for it)") in log
    assert "Failure reasons" not in log and "No feasible result" not in log
    assert [t.number for t in load(tmp_path).trials if t.user_attrs.get("interrupted")] == [0]
