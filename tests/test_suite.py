"""scripts/suite.py without running a study: its commands, and its table from a real study's summary.json."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.loading import load_file

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / "tests" / "data" / "study_before_record.summary.json"


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    return load_file(ROOT / "scripts" / "suite.py")


def test_the_dry_run_lists_the_default_study_of_every_tiny_family() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite.py"), "--dry-run", "--output-root=/tmp/s",
                           "--", "study.n_trials=4"], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    families = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*-tiny.yaml"))
    assert {"t5-tiny", "mixtral-tiny", "resnet-tiny", "gpt2-tiny"} <= set(families)
    assert lines == [f"python -m autocompile +model={f} workload.device=cpu output_root=/tmp/s study.name=suite-{f} "
                     "study.n_trials=4" for f in families]


def test_the_table_of_a_real_study(suite: ModuleType) -> None:
    summary = json.loads(SUMMARY.read_text())
    text = suite.table([summary])
    header, _, line = text.splitlines()[:3]
    assert "time to train vs default compile" in header
    # That study's winner was eager itself and default compile was not among its candidates.
    assert line.split(" | ")[1:5] == ["compile.scope=none", "5.30", "is the winner", "is the winner"]
    assert "not raced" in line and "1 of 1" in line and "| 0.6 |" in line
    assert "| 1 fresh-process rounds |" in line  # that study timed its verdict in fresh-process rounds
    assert "none of the 1 families raced default compile" in text


def test_the_table_says_how_each_verdict_was_timed(suite: ModuleType) -> None:
    summary = json.loads(SUMMARY.read_text())
    verdict = summary["verdicts"][0]
    summary["verdicts"] = [
        {**verdict, "how": "paired windows side by side in 7 processes (process means)"},
        {**verdict, "how": "paired windows side by side in 7 processes (process means)"},
        {**verdict, "how": "interleaved rounds", "identical": True},  # the same program: nothing to time
        {**verdict, "how": "interleaved rounds", "failure": "not timed beside the winner (not_same_program)"}]
    assert "| 2 side by side, 1 not timed |" in suite.table([summary])


def test_the_table_names_what_the_confirmation_left_undetermined(suite: ModuleType) -> None:
    summary = json.loads(SUMMARY.read_text())
    summary["confirmed"]["undetermined"] = [{"label": "#1", "name": "defaults", "more_processes": 11}]
    assert "| defaults undetermined (11 more processes) |" in suite.table([summary])
    summary["confirmed"]["undetermined"] = []
    assert "| decided |" in suite.table([summary])


def test_the_geometric_mean_is_over_the_families_that_raced_default_compile(suite: ModuleType) -> None:
    real = json.loads(SUMMARY.read_text())
    faster = copy.deepcopy(real)  # the same study, had a compiled winner beaten both baselines
    faster["model"], faster["confirmed"]["winner"]["baseline"] = "fam-a", None
    faster["confirmed"]["gains"] = {
        base: {"step": {"change": change, "low": change - 0.1, "high": change + 0.05, "rounds": 3, "measurable": True},
               "score": {"change": change / 2, "low": None, "high": None, "rounds": 1, "measurable": False}}
        for base, change in (("eager", -0.3), ("compile", -0.2))}
    compile_won = copy.deepcopy(real)
    compile_won["model"], compile_won["confirmed"]["winner"]["baseline"] = "fam-b", "compile"
    text = suite.table([faster, compile_won, real])
    assert ("| fam-a | compile.scope=none | 5.30 | -30.0% [-40.0, -25.0] | -15.0% (1 round) "
            "| -20.0% [-30.0, -15.0]") in text
    # Winner / default compile: 0.8 and 1.0 (default compile won); the third did not race it.
    assert f"step time: x{(0.8 * 1.0) ** 0.5:.3f}" in text and "over 2 of 3 families" in text
    assert f"time to train: x{(0.9 * 1.0) ** 0.5:.3f}" in text


def test_a_question_auto_did_not_ask_is_neither_answered_nor_asked(suite: ModuleType) -> None:
    verdicts = [{"measurable": True, "how": "side by side in 7 processes"},
                {"measurable": False, "how": "side by side in the confirmation's 7 processes"},
                {"not_asked": "activation checkpointing trades step time for memory", "how": "interleaved rounds"}]
    assert suite.decided({"verdicts": verdicts}) == "1 of 2"
    assert suite.verdict_rounds({"verdicts": verdicts}) == "2 side by side"
