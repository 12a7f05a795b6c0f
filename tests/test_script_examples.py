"""The example scripts (examples/scripts/) are tunable as they are: each measured once by the real path (the
launcher starts it under torchrun with the agent loaded), tiny sizes and eager/aot_eager backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_script import NEEDED, SMALL, run


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # scripts run from the directory the command runs in


def test_prepare_hands_the_model_to_the_trial_in_place_of_torch_compile(tmp_path: Path) -> None:
    """train_gpt_prepare.py calls no torch.compile: its prepare() line is where the trial's knobs are applied."""
    result = run(tmp_path, "examples/scripts/train_gpt_prepare.py", f"{SMALL} --max_iters=20",
                 {"compile.scope": "regional", "compile.backend": "eager"})
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"][:2] == ["transformer.h.0", "transformer.h.1"] and result["compiled_coverage"] == 1.0
    (call,) = result["script"]["compile_calls"]
    assert call["target"] == "GPT" and call["where"].startswith("train_gpt_prepare.py:")  # the prepare line
    assert result["throughput_unit"] == "tokens" and len(result["losses"]) == NEEDED


def test_prepare_in_the_eager_baseline_trial_compiles_nothing(tmp_path: Path) -> None:
    result = run(tmp_path, "examples/scripts/train_gpt_prepare.py", f"{SMALL} --max_iters=20",
                 {"compile.scope": "none"})
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"] == [] and result["graph_count"] == 0 and result["throughput_unit"] == "tokens"


@pytest.mark.integration  # imports transformers in the script's process (20-40 s on 2 busy cores)
def test_a_transformers_model_in_a_plain_loop_with_a_scheduler(tmp_path: Path) -> None:
    result = run(tmp_path, "examples/scripts/train_hf.py", "--seq_len=16 --batch_size=2 --max_iters=20",
                 {"compile.scope": "regional", "compile.backend": "eager"})
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"][:2] == ["transformer.h.0", "transformer.h.1"]  # GPT2Block, found as repeated blocks
    assert result["script"]["compile_calls"][0]["target"] == "GPT2LMHeadModel"
    # input_ids= and labels= as keywords: the first integer tensor, 2 x 16 tokens per step.
    assert result["throughput_unit"] == "tokens"
    assert result["tokens_per_s"] == pytest.approx(2 * 16 / result["step_s"], rel=0.5)
    assert len(result["losses"]) == NEEDED  # the model's own loss, one per step


@pytest.mark.integration  # a real 2-rank torchrun launch
def test_a_two_rank_ddp_script_compiling_its_ddp_module(tmp_path: Path) -> None:
    result = run(tmp_path, "examples/scripts/train_ddp.py", "--dim=16 --batch_size=4 --max_iters=20",
                 {"compile.scope": "module", "compile.backend": "aot_eager"}, nproc=2)
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2
    assert result["compiled"] == ["DistributedDataParallel(model)"]  # the script's order: compile of DDP
    assert result["throughput_unit"] == "samples"
    assert result["tokens_per_s"] == pytest.approx(2 * 4 / result["step_s"], rel=0.5)  # both ranks' samples
