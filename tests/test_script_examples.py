"""The example scripts (examples/scripts/) are tunable as they are: each measured once by the real path (the
launcher starts it under torchrun with the agent loaded), tiny sizes and eager/aot_eager backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_rates
from tests.test_script import NEEDED, SMALL, run


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # scripts run from the directory the command runs in


PREPARE = "examples/scripts/train_gpt_prepare.py"


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


def test_prepare_reaches_checkpointing_and_the_optimizer_the_script_built(tmp_path: Path) -> None:
    """Knobs a script without prepare() is never asked: applied to its own objects, a program of their own."""
    args = f"{SMALL} --max_iters=20"
    plain = run(tmp_path / "plain", PREPARE, args, {"compile.scope": "regional", "compile.backend": "eager"})
    both = run(tmp_path / "both", PREPARE, args, {"compile.scope": "regional", "compile.backend": "eager",
                                                  "ac.policy": "block", "optim.impl": "fused"})
    assert plain["status"] == both["status"] == "ok", (plain.get("reason"), both.get("reason"))
    prepared = both["script"]["prepared"]
    assert prepared["where"].startswith("train_gpt_prepare.py:") and prepared["optimizer"] == "AdamW"
    assert prepared["fused"] == [True] and prepared["checkpointed"] == ["transformer.h.0", "transformer.h.1"]
    assert plain["script"]["prepared"]["fused"] == [None] and plain["script"]["prepared"]["checkpointed"] == []
    assert both["fingerprint"] != plain["fingerprint"]  # not twins: the study times both
    assert both["losses"] == pytest.approx(plain["losses"], rel=1e-3)  # the same training, run differently


def test_a_prepare_the_script_never_reaches_fails_the_trial_that_needs_it(tmp_path: Path) -> None:
    """The file calls prepare() (so its knobs are asked), but not on this run's path: a trial that needs it
    would time the plain program under another name, so it fails saying so."""
    script = tmp_path / "train_gpt_prepare_skipped.py"
    text = (ROOT / PREPARE).read_text()
    line = "model, optimizer = autocompile.prepare(model, optimizer)  # the one line"
    assert line in text
    script.write_text(text.replace(line, "if False:\n    " + line))
    result = run(tmp_path, script, f"{SMALL} --max_iters=20", {"compile.scope": "none", "optim.impl": "foreach"})
    assert result["status"] == "failed" and result["failure"] == "cannot_take_over"
    assert "optim.impl=foreach needs autocompile.prepare(model, optimizer) before training, and the script " \
           "never called it" in result["reason"]


@pytest.mark.integration  # imports transformers in the script's process (20-40 s on 2 busy cores)
def test_a_transformers_model_in_a_plain_loop_with_a_scheduler(tmp_path: Path) -> None:
    result = run(tmp_path, "examples/scripts/train_hf.py", "--seq_len=16 --batch_size=2 --max_iters=20",
                 {"compile.scope": "regional", "compile.backend": "eager"})
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"][:2] == ["transformer.h.0", "transformer.h.1"]  # GPT2Block, found as repeated blocks
    assert result["script"]["compile_calls"][0]["target"] == "GPT2LMHeadModel"
    # input_ids= and labels= as keywords: the first integer tensor, 2 x 16 tokens per step.
    assert result["throughput_unit"] == "tokens"
    assert_rates(result, 2 * 16 * 1 * 1)  # no accumulation, 1 rank: exactly 32 tokens per step in every window
    assert len(result["losses"]) == NEEDED  # the model's own loss, one per step


@pytest.mark.integration  # a real 2-rank torchrun launch
def test_a_two_rank_ddp_script_compiling_its_ddp_module(tmp_path: Path) -> None:
    result = run(tmp_path, "examples/scripts/train_ddp.py", "--dim=16 --batch_size=4 --max_iters=20",
                 {"compile.scope": "module", "compile.backend": "aot_eager"}, nproc=2)
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2
    assert result["compiled"] == ["DistributedDataParallel(model)"]  # the script's order: compile of DDP
    assert result["throughput_unit"] == "samples"
    assert_rates(result, 4 * 1 * 2)  # both ranks' 4 samples, no accumulation: exactly 8 per step in every window


@pytest.mark.integration  # real 2-rank torchrun launches
@pytest.mark.parametrize(("order", "compiled"), [("ddp_of_compiled", ["model"]),
                                                 ("compile_of_ddp", ["DistributedDataParallel(model)"])])
def test_prepare_puts_ddp_inside_or_outside_compile_as_the_trial_asks(tmp_path: Path, order: str,
                                                                      compiled: list[str]) -> None:
    """train_gpt_prepare.py wraps DDP itself after prepare(): the trial's wrap order decides which is compiled."""
    result = run(tmp_path, PREPARE, f"{SMALL} --max_iters=20", {"compile.scope": "module",
                 "compile.backend": "aot_eager", "ddp.wrap_order": order}, nproc=2)
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2 and result["compiled"] == compiled
    assert result["script"]["compile_calls"][-1]["where"].startswith("train_gpt_prepare.py:")
