"""``task=compare``: the head-to-head a user asks for, end to end from the command line on the sleeping
test model (bfloat16 autocast makes every block sleep 20x longer: certainly slower)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli_in_process

COMPARE = ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "workload.batch_size=2",
           "workload.seq_len=[16]", "workload.device=cpu", "workload.threads=1", "measure.windows=2",
           "measure.window_steps=2", "measure.warmup_steps=2", "measure.max_timed_s=0.5",
           "+workload.optimizer.foreach=false", "task=compare", "compare.processes=2", "compare.min_rounds=4",
           "compare.max_timed_s=0.5", "compare.window_steps=2"]


def compare_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autocompile", *COMPARE, f"output_root={tmp_path}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_compare_prints_the_pair_and_writes_compare_json(tmp_path: Path) -> None:
    done = compare_cli(tmp_path, "+model.block_sleep_s=0.001",
                       'compare.candidates=["compile.scope=none","compile.scope=none amp.dtype=bfloat16",'
                       '"compile.scope=none"]')
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("*/compare.json")
    report = json.loads(path.read_text())
    # compare.processes=2 asked: a decision needs 3 side-by-side processes, so 3 ran, saying so (issue 50).
    assert report["method"] == "side_by_side" and report["processes"] == 3
    assert "compare.processes=2: a side-by-side decision needs 3 processes" in done.stdout + done.stderr
    assert [c["label"] for c in report["candidates"]] == [
        "0: compile.scope=none", "1: compile.scope=none amp.dtype=bfloat16", "2: compile.scope=none"]
    assert len(list(path.parent.glob("compare/*/cold*"))) == 2  # the A/A pair had one cold run
    slower, same = report["pairs"]
    # Three processes: the process-means interval has 2 df (issue 26), wide but above zero for a 6x slower step.
    # The verdict may instead be the honest disagreement with the cold runs alone: each is one process, timed
    # at another moment on cores a second test worker shares (CI saw +1054 % side by side, +803 % alone).
    honest = ("measurably slower", "neither ratio is the answer")
    assert (slower["a"], slower["b"]) == (0, 1) and slower["low"] > 0
    assert any(v in slower["verdict"] for v in honest), slower["verdict"]
    assert same["step"]["processes"] == 3 and same["step"]["rounds"] >= 12
    assert all(c["step_s"] and c["compile_s"] is not None for c in report["candidates"])
    printed = " ".join(done.stdout.split())  # rich wraps long lines
    assert "side by side in 3 fresh processes" in printed and any(v in printed for v in honest)


@pytest.mark.integration
def test_candidates_that_cannot_share_a_process_are_compared_in_fresh_processes(tmp_path: Path) -> None:
    done = compare_cli(tmp_path, "+model.behaviour=alone",
                       'compare.candidates=["compile.scope=none","compile.scope=none"]')
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(next(tmp_path.glob("*/compare.json")).read_text())
    assert report["method"] == "fresh_processes"
    assert "one instance per process" in report["why"]
    assert report["pairs"][0]["step"]["basis"] == "fresh-process rounds"
    assert "not side by side" in done.stdout


# Two CLI subprocesses (10-30 s on 2 busy cores). Default run: the same checks in process,
# test_a_bad_candidate_fails_in_process_before_anything_runs.
@pytest.mark.integration
def test_a_bad_candidate_fails_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    done = compare_cli(tmp_path, 'compare.candidates=["compile.scope=none","compile.mode=fastest"]')
    assert done.returncode == 2
    assert "compare.candidates 'compile.mode=fastest'" in done.stderr and not list(tmp_path.iterdir())
    done = compare_cli(tmp_path, 'compare.candidates=["compile.scope=none"]')
    assert done.returncode == 2 and "needs two or more compare.candidates" in done.stderr


def test_a_bad_candidate_fails_in_process_before_anything_runs(tmp_path: Path) -> None:
    code, stderr = cli_in_process(*COMPARE, f"output_root={tmp_path}",
                                  'compare.candidates=["compile.scope=none","compile.mode=fastest"]')
    assert code == 2
    assert "compare.candidates 'compile.mode=fastest'" in stderr and not list(tmp_path.iterdir())
    code, stderr = cli_in_process(*COMPARE, f"output_root={tmp_path}", 'compare.candidates=["compile.scope=none"]')
    assert code == 2 and "needs two or more compare.candidates" in stderr
