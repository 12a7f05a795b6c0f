"""``autocompile.prepare(model, optimizer)``: nothing changes without a winner; a winner runs compiled as measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import autocompile


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(use_prepare: bool, best_config: Path | None = None, steps: int = 4) -> tuple[list[float], Net]:
    """A user's plain loop; ``use_prepare`` adds the one line."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if use_prepare:
        prepared = autocompile.prepare(model, optimizer, best_config=best_config)
        assert prepared[0] is model and prepared[1] is optimizer  # the same objects, changed in place at most
    data = torch.randn(steps, 4, 8, generator=torch.Generator().manual_seed(1))
    losses = []
    for x in data:
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model


def test_without_a_winner_the_script_trains_exactly_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOCOMPILE_BEST_CONFIG", raising=False)
    plain, plain_model = train(use_prepare=False)
    prepared, prepared_model = train(use_prepare=True)
    assert prepared == plain  # bit for bit
    assert all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), prepared_model.parameters(), strict=True))
    assert "forward" not in prepared_model.__dict__  # nothing wrapped, nothing compiled


def test_a_named_winner_is_applied_in_place_and_trains_as_eager_does(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters

    winner = tmp_path / "best_config.yaml"
    winner.write_text(yaml.safe_dump({"study": "s", "trial": 3, "knobs": {
        "compile.scope": "regional", "compile.backend": "eager", "compile.rest": "eager", "ac.policy": "block"}}))
    monkeypatch.setenv("AUTOCOMPILE_BEST_CONFIG", str(winner))  # named the way a launcher would
    torch._dynamo.reset()
    frames = counters["frames"]["ok"]
    eager, _ = train(use_prepare=False)
    compiled, model = train(use_prepare=True)
    assert all("forward" in block.__dict__ for block in model.blocks)  # each block's forward compiled in place
    assert "forward" not in model.head.__dict__  # compile.rest=eager
    assert counters["frames"]["ok"] > frames  # dynamo compiled the blocks
    assert compiled == pytest.approx(eager, rel=1e-5)


def test_a_winner_prepare_cannot_apply_yet_is_refused_with_the_way_out(tmp_path: Path) -> None:
    winner = tmp_path / "best_config.yaml"
    winner.write_text(yaml.safe_dump({"knobs": {"compile.scope": "module", "amp.dtype": "bfloat16"}}))
    with pytest.raises(ValueError, match=r"cannot apply \{'amp.dtype': 'bfloat16'\} yet: use autocompile.apply"):
        autocompile.prepare(Net(), None, best_config=winner)
    winner.write_text(yaml.safe_dump({"knobs": {"compile.scope": "train_step"}}))
    with pytest.raises(ValueError, match=r"cannot apply \{'compile.scope': 'train_step'\} yet"):
        autocompile.prepare(Net(), None, best_config=winner)


def test_a_winners_optimizer_implementation_is_set_on_the_scripts_own_optimizer(tmp_path: Path) -> None:
    """The scheduler the script built before prepare() holds the same optimizer, now fused."""
    winner = tmp_path / "best_config.yaml"
    winner.write_text(yaml.safe_dump({"knobs": {"compile.scope": "none", "optim.impl": "fused"}}))
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer)
    assert autocompile.prepare(model, optimizer, best_config=winner)[1] is optimizer
    assert all(g["fused"] for g in optimizer.param_groups) and optimizer._step_supports_amp_scaling
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * (1 / 3 + (1 - 1 / 3) / 5))


def test_the_knobs_prepare_opens_are_asked_only_of_a_script_that_calls_it(tmp_path: Path) -> None:
    from autocompile.config.knobs import KnobError, TrialConfig
    from autocompile.config.script_settings import calls_prepare, script_env

    root = Path(__file__).resolve().parent.parent / "examples" / "scripts"
    assert calls_prepare(root / "train_gpt_prepare.py") and not calls_prepare(root / "train_gpt.py")
    (tmp_path / "a.py").write_text("from autocompile import prepare\nmodel = prepare(model)\n")
    (tmp_path / "b.py").write_text("def prepare(m):\n    return m\nmodel = prepare(model)\n")  # not ours
    assert calls_prepare(tmp_path / "a.py") and not calls_prepare(tmp_path / "b.py")
    knobs = {"compile.scope": "regional", "ac.policy": "block", "optim.impl": "fused"}
    assert TrialConfig.from_flat(knobs, script_env("cpu", 1, prepares=True)).optim.impl == "fused"
    with pytest.raises(KnobError, match=re.escape("ac.policy='block' does not apply: it needs a job autocompile "
                                                  "runs, or a script that calls autocompile.prepare")):
        TrialConfig.from_flat(knobs, script_env("cpu", 1, prepares=False))
    ddp = {"compile.scope": "module", "ddp.wrap_order": "compile_of_ddp"}
    assert TrialConfig.from_flat(ddp, script_env("cpu", 2, prepares=True)).ddp.wrap_order == "compile_of_ddp"
