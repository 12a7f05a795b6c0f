"""A script's candidates side by side inside its own processes (``task=compare`` of ``script.path``): the agent
holds every candidate's compile of the script's model and switches them window by window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autocompile.trial.timing.result import TrialResult
from tests.conftest import ROOT
from tests.test_script_cli import settings

BLOCKS = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


torch.manual_seed(0)
model = torch.compile(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(100000):  # the agent ends the process once it has measured
    model(torch.randn(4, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""
FAST = ["measure.warmup_steps=2", "measure.windows=2", "measure.window_steps=2", "measure.precision=0",
        "compare.min_rounds=4", "compare.max_timed_s=0.5", "compare.window_steps=2"]
MODULE = "compile.scope=module compile.backend=aot_eager"


def script_settings(tmp_path: Path, candidates: list[str], *more: str) -> Any:
    (tmp_path / "blocks.py").write_text(BLOCKS)
    return settings("script.path=blocks.py", "task=compare", *FAST, f"output_root={tmp_path}", *more,
                    "compare.candidates=[" + ",".join(f'"{c}"' for c in candidates) + "]")


# Four script processes (20-38 s): integration. The default run covers which candidates share a script's process
# (below) and the side-by-side processes and intervals on the model path (tests/test_sidebyside.py).
@pytest.mark.integration
def test_a_scripts_compare_times_eager_module_and_module_again_side_by_side_in_its_own_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autocompile.study.compare import compare
    from autocompile.study.phases import sidebyside

    monkeypatch.chdir(tmp_path)
    s = script_settings(tmp_path, [MODULE, "compile.scope=none", MODULE], "compare.processes=3")
    report = compare(s, tmp_path / "run").as_dict()
    assert (report["method"], report["why"]) == ("side_by_side", "")
    (out,) = (tmp_path / "run" / "compare").iterdir()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["cold0", "cold1", "process0", "process1",
                                                                   "process2"]
    results = [json.loads((out / f"process{p}" / "result.json").read_text()) for p in (0, 1, 2)]
    cold = {0: json.loads((out / "cold0" / "result.json").read_text()),
            1: json.loads((out / "cold1" / "result.json").read_text())}
    labels = [f"0: {MODULE}", "1: compile.scope=none", f"2: {MODULE}"]
    for p, result in enumerate(results):
        assert result["status"] == "ok" and result["order"] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]][p]  # rotated
        assert [c["label"] for c in result["candidates"]] == labels
        for c, alone in zip(result["candidates"], (cold[0], cold[1], cold[0]), strict=True):
            assert c["status"] == "ok", c
            assert c["fingerprint"] == alone["fingerprint"]  # the program it compiled alone, beside the others
            assert len(c["step_s_windows"]) == len(c["step_cpu_s_windows"]) == result["rounds"] >= 4
        assert [c["compiled_coverage"] for c in result["candidates"][:2]] == [1.0, 0.0]
    assert cold[0]["fingerprint"] != "eager:script" == cold[1]["fingerprint"]
    # What the model path's processes give the intervals, read unchanged.
    per = sidebyside.windows([TrialResult.from_json(r) for r in results])
    assert sorted(per) == labels and all(sorted(by_process) == [0, 1, 2] for by_process in per.values())
    eager, again = report["pairs"]
    assert (eager["b"], again["b"]) == (1, 2)
    assert eager["step"]["processes"] == 3 and eager["step"]["basis"] != "fresh-process rounds"
    assert again["step"]["low"] < 0 < again["step"]["high"]  # A/A: the same candidate twice


def test_a_scripts_candidates_that_cannot_share_a_process_say_why() -> None:
    from autocompile.config.knobs import TrialConfig
    from autocompile.study.phases.sidebyside import Member, cannot_share

    def why(texts: list[str], *more: str, script: str = "examples/scripts/train_gpt.py",
            cold: TrialResult | None = None) -> str | None:
        s = settings(f"script.path={script}", *more)
        members = [Member(t, TrialConfig.from_flat({k: {"True": True}.get(v, v) for k, v in (
            kv.split("=") for kv in t.split())}, s.env), cold or TrialResult()) for t in texts]
        return cannot_share(members, s)

    # Only how the same units are compiled: mode, options, dynamic, fullgraph, backend, none against module.
    assert why(["compile.scope=none", "compile.scope=module compile.mode=max-autotune-no-cudagraphs",
                "compile.scope=module compile.options.shape_padding=True compile.dynamic=True",
                "compile.scope=module compile.fullgraph=True compile.backend=aot_eager"]) is None
    # The model whole against its blocks: every unit either compiles switches (tests/test_script_sidebyside.py).
    assert why(["compile.scope=none", "compile.scope=module", "compile.scope=regional"]) is None
    assert "nested compile regions" in why(["compile.scope=none", "compile.scope=regional compile.granularity=nested"])
    assert "several ranks" in why(["compile.scope=none", "compile.scope=module"], "workload.nproc_per_node=2")
    prepares = "examples/scripts/train_gpt_prepare.py"  # calls autocompile.prepare: its knobs open
    assert "optim.impl differs" in why(["optim.impl=foreach", "optim.impl=fused"], script=prepares)
    assert "ac.policy differs" in why(["ac.policy=none", "ac.policy=block"], script=prepares)
    # A function the script compiles is compiled once, where the script calls torch.compile: never switched.
    calls = [{"target": "GPT", "module": True}, {"target": "train_step", "module": False}]
    function = TrialResult(script={"compile_calls": calls})
    assert "the function(s) train_step" in why(["compile.scope=none", "compile.scope=module"], cold=function)


@pytest.mark.integration
def test_regional_beside_module_compiles_what_an_evaluation_at_step_0_made_dynamic_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nanoGPT's evaluation at step 0 sends its 2-D ids and 1-D positions through nn.Embedding's one frame: alone,
    # regional's first training graph of the token embedding is symbolic. Beside module, the evaluation ran under
    # whichever candidate went first, and regional compiled it static, another program, until each candidate
    # took its own process's automatic-dynamic memory (trial/timing/shape_state).
    from autocompile.study.compare import compare
    from tests.test_script_cli import GPT, SMALL

    monkeypatch.chdir(ROOT)
    args = SMALL.replace("--eval_interval=4", "--eval_interval=1000")
    s = settings(f"script.path={GPT}", f"script.args='{args}'", "task=compare", *FAST, "compare.processes=2",
                 f"output_root={tmp_path}", f'compare.candidates=["{MODULE}","compile.scope=regional '
                 'compile.backend=aot_eager"]')
    report = compare(s, tmp_path / "run").as_dict()
    # regional goes first in one process, second in the other
    assert (report["method"], report["why"]) == ("side_by_side", "")
    assert all(p["step"]["basis"] != "fresh-process rounds" for p in report["pairs"])


@pytest.mark.integration
def test_the_model_whole_and_its_blocks_switch_side_by_side_each_with_the_program_it_compiles_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A script study's confirmation holds default compile and regional: the model's forward and its blocks'
    # are switched together, and each candidate's fingerprint must be its cold run's, alone.
    from autocompile.study.compare import compare

    monkeypatch.chdir(tmp_path)
    regional = "compile.scope=regional compile.backend=aot_eager"
    s = script_settings(tmp_path, [MODULE, regional, "compile.scope=none"], "compare.processes=2")
    report = compare(s, tmp_path / "run").as_dict()
    assert (report["method"], report["why"]) == ("side_by_side", "")
    (out,) = (tmp_path / "run" / "compare").iterdir()
    cold = [json.loads((out / f"cold{k}" / "result.json").read_text()) for k in range(3)]
    assert len({c["fingerprint"] for c in cold}) == 3  # three programs
    for p in (0, 1):
        result = json.loads((out / f"process{p}" / "result.json").read_text())
        assert result["status"] == "ok"
        for c, alone in zip(result["candidates"], cold, strict=True):
            assert c["status"] == "ok" and c["fingerprint"] == alone["fingerprint"], c
            assert c["compiled"] == alone["compiled"] and c["compiled_coverage"] == alone["compiled_coverage"]


@pytest.mark.integration
def test_a_script_studys_confirmation_times_its_candidates_side_by_side_with_their_cold_numerics(
        tmp_path: Path) -> None:
    # Before: a script study's phases ran fresh-process rounds only (intervals of +-40-100 % on train_gpt.py).
    # The candidates take turns on one model, so their losses there are not theirs: the numerics are the cold runs'.
    import subprocess
    import sys

    (tmp_path / "blocks.py").write_text(BLOCKS)
    done = subprocess.run([sys.executable, "-m", "autocompile", "script.path=blocks.py", f"output_root={tmp_path}",
                           "study.n_trials=3", "study.verdicts=none", "compile.backend=aot_eager",
                           "compare.processes=2", "tracking.enabled=false", *FAST[:4]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (summary,) = tmp_path.glob("*/summary.json")
    confirmed = json.loads(summary.read_text())["confirmed"]
    assert confirmed["method"] == {"method": "side_by_side", "why": ""}
    # each timed, and feasible, in every process (2 asked, 3 run: a decision needs 3)
    assert [c["rounds"] for c in confirmed["candidates"]] == [3, 3, 3]
