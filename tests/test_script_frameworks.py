"""Scripts built on a training framework, each started as its user starts it: Accelerate's launcher and config,
transformers' ``Trainer(torch_compile=True)``, Lightning's ``Trainer``. The agent takes over what the framework
compiles with the trial's knobs (eager under ``compile.scope=none``) and times the steps its optimizer takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autocompile.config.script_settings import ScriptSettings
from tests.conftest import ROOT, launched
from tests.test_script import script_spec


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # scripts run from the directory the command runs in


ACCELERATE_SCRIPT = """
import json, os, sys
import torch
from accelerate import Accelerator

accelerator = Accelerator()  # reads what accelerate launch hands it: the config's mixed precision
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json"), "w") as f:
    json.dump({"mixed_precision": accelerator.mixed_precision, "argv0": os.path.basename(sys.argv[0])}, f)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = accelerator.prepare(model, opt)
model = torch.compile(model)
for i in range(40):
    with accelerator.autocast():
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.integration
def test_a_script_launched_with_accelerate_gets_its_accelerate_configs_mixed_precision(tmp_path: Path) -> None:
    """``script.launcher=accelerate`` starts ``accelerate launch --config_file`` on the script: the config's bf16
    reaches ``Accelerator()`` (under python or torchrun it was silently missing), and the agent times the steps."""
    script = tmp_path / "train_acc.py"
    script.write_text(ACCELERATE_SCRIPT)
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: bf16\n"
                      "num_machines: 1\nnum_processes: 1\nuse_cpu: true\n")
    spec = script_spec(script, "", {"compile.scope": "module", "compile.backend": "eager"})
    spec.script = ScriptSettings(str(script), "", launcher="accelerate", accelerate_config=str(config))
    result = launched(tmp_path / "trial", spec)
    assert result["status"] == "ok", result.get("reason")
    assert json.loads((tmp_path / "seen.json").read_text()) == {"mixed_precision": "bf16", "argv0": "train_acc.py"}
    assert "accelerate.commands.launch --config_file" in (tmp_path / "trial" / "cmd.txt").read_text()
    with pytest.raises(ValueError, match=r"needs script\.launcher=accelerate"):
        ScriptSettings(str(script), "", accelerate_config=str(config))


TRAINER_SCRIPT = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128))
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (256, 16))]
args = TrainingArguments(output_dir="out", torch_compile=True, max_steps=60, per_device_train_batch_size=2,
                         use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                         dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=data).train()
"""


@pytest.mark.integration
def test_a_transformers_trainer_with_torch_compile_has_its_compile_taken_over(tmp_path: Path) -> None:
    """``TrainingArguments(torch_compile=True)``: the Trainer compiles through Accelerate's ``torch.compile`` call,
    which the agent takes over with the trial's scope; eager under ``compile.scope=none``."""
    script = tmp_path / "train_hf.py"
    script.write_text(TRAINER_SCRIPT)
    for knobs, compiled in (({"compile.scope": "module", "compile.backend": "eager"}, True),
                            ({"compile.scope": "none"}, False)):
        result = launched(tmp_path / f"trial_{knobs['compile.scope']}", script_spec(script, "", knobs))
        assert result["status"] == "ok", result.get("reason")
        assert bool(result["compiled"]) == compiled, result["compiled"]


LIGHTNING_SCRIPT = """
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True) for _ in range(2))
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        return nn.functional.cross_entropy(self(ids[:, :-1]).reshape(-1, 64), ids[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


data = DataLoader(TensorDataset(torch.randint(0, 64, (256, 17))), batch_size=4)
model = COMPILED(LM())
L.Trainer(max_steps=60, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False).fit(model, data)
"""


@pytest.mark.integration
def test_a_lightning_trainer_script_is_tuned_whether_it_compiles_its_module_or_not(tmp_path: Path) -> None:
    """Lightning's ``Trainer.fit`` takes a ``torch.compile``d LightningModule (it unwraps an ``OptimizedModule``; it
    patches no ``torch.compile`` of its own) or a plain one. The agent compiles the LightningModule in place, so
    ``fit`` gets the module it accepts: with the script's ``torch.compile`` call, and without one (the module that
    owns the optimizer's weights, found at the first ``optimizer.step(closure)``), the same program, every weight
    inside it; eager under ``compile.scope=none``; regional compiles the blocks."""
    pytest.importorskip("lightning")
    fingerprints = {}
    for name, wrap in (("compiles", "torch.compile"), ("plain", "")):
        script = tmp_path / f"train_pl_{name}.py"
        script.write_text(LIGHTNING_SCRIPT.replace("COMPILED", wrap))
        for knobs in ({"compile.scope": "module", "compile.backend": "aot_eager"}, {"compile.scope": "none"},
                      {"compile.scope": "regional", "compile.backend": "aot_eager"}):
            scope = knobs["compile.scope"]
            if name == "plain" and scope == "regional":
                continue
            result = launched(tmp_path / f"trial_{name}_{scope}", script_spec(script, "", knobs))
            assert result["status"] == "ok", (name, scope, result.get("reason"))
            if scope == "none":
                assert not result["compiled"]
                continue
            assert result["compiled"] == (["model"] if scope == "module" else
                                          ["blocks.0", "blocks.1", "embed", "head"]), result["compiled"]
            assert result["compiled_coverage"] == 1.0 and result["graph_breaks"] == 0
            fingerprints[name, scope] = result["fingerprint"]
    assert fingerprints["compiles", "module"] == fingerprints["plain", "module"] != fingerprints["compiles", "regional"]


PATCHING_LIBRARY = """
import torch

calls = []
_previous = torch.compile  # what stood there when the library was imported: the agent's, inside a trial


def compile_with_markers(model=None, **kwargs):  # as profilers and fine-tuning kits wrap torch.compile
    calls.append(sorted(kwargs))
    return _previous(model, **kwargs)


torch.compile = compile_with_markers
"""
PATCHED_SCRIPT = """
import json, os
import torch
import patching_library  # patches torch.compile on import, as the script's libraries may

model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)),
                      mode="default")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.json"), "w") as f:
    json.dump(patching_library.calls, f)
for i in range(40):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.integration
def test_a_library_that_wraps_torch_compile_chains_with_the_agent(tmp_path: Path) -> None:
    """A library the script imports wraps ``torch.compile`` (its wrapper calls what stood before: the agent's):
    the library's wrapper still runs, and the trial's knobs still decide what is compiled (eager under none)."""
    (tmp_path / "patching_library.py").write_text(PATCHING_LIBRARY)
    script = tmp_path / "train_patched.py"
    script.write_text(PATCHED_SCRIPT)
    for knobs, compiled in (({"compile.scope": "module", "compile.backend": "eager"}, True),
                            ({"compile.scope": "none"}, False)):
        scope = knobs["compile.scope"]
        result = launched(tmp_path / f"trial_{scope}", script_spec(script, "", knobs))
        assert result["status"] == "ok", (scope, result.get("reason"))
        assert bool(result["compiled"]) == compiled, (scope, result["compiled"])
        assert json.loads((tmp_path / "calls.json").read_text()) == [["mode"]]  # the library saw the script's call
