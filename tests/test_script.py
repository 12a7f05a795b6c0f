"""The user's own script, tuned as it is: the agent takes over its torch.compile, times its optimizer steps and
writes result.json; a bad script is a failed trial with a one-line reason.

Each run is the real path: the launcher starts the script under torchrun with the agent's sitecustomize first on
PYTHONPATH (aot_eager/eager backends and a tiny model keep each run to seconds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autocompile.config.knobs import KnobError, TrialConfig
from autocompile.config.script_settings import ScriptSettings, ScriptSpec, calls_prepare, script_env
from autocompile.config.spec import MeasureSettings, Workload
from autocompile.trial.launcher import SCRATCH_PREFIX, scratch_dir
from tests.conftest import ROOT, assert_rates, launched, survivors

GPT = "examples/scripts/train_gpt.py"
SMALL = "--n_layer=2 --n_embd=32 --n_head=2 --block_size=16 --batch_size=2 --eval_interval=4 --eval_iters=1"
MEASURE = MeasureSettings(warmup_steps=2, windows=2, window_steps=2, precision=0.0, timeout_s=240)
NEEDED = 2 + 2 * 2


def script_spec(path: str | Path, args: str, knobs: dict[str, Any], *, nproc: int = 1,
                measure: MeasureSettings = MEASURE) -> ScriptSpec:
    # only valid configurations are launched: the knobs a script that calls prepare() opens, where it does
    config = TrialConfig.from_flat(knobs, script_env("cpu", nproc, calls_prepare(path)))
    return ScriptSpec(knobs=config.flat(), script=ScriptSettings(str(path), args),
                      workload=Workload(nproc_per_node=nproc, threads=1), measure=measure, device="cpu", threads=1)


def run(tmp_path: Path, path: str | Path, args: str, knobs: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return launched(tmp_path / "trial", script_spec(path, args, knobs, **kw))


def script_file(tmp_path: Path, name: str, body: str) -> Path:
    """``name.py`` in ``tmp_path``: ``body`` (indented as written here) after ``import torch``."""
    script = tmp_path / f"{name}.py"
    script.write_text("import torch\n" + textwrap.dedent(body))
    return script


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # scripts run from the directory the command runs in


@pytest.mark.parametrize(("knobs", "compiled"), [
    ({"compile.scope": "none"}, []),
    # A real script trial each (8-17 s): module is integration (default run: the eager baseline and regional here).
    pytest.param({"compile.scope": "module", "compile.backend": "aot_eager"}, ["model"],
                 marks=pytest.mark.integration),
    ({"compile.scope": "regional", "compile.backend": "aot_eager"},
     ["transformer.h.0", "transformer.h.1", "transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"]),
])
def test_a_nanogpt_shaped_script_is_measured_with_no_line_changed(tmp_path: Path, knobs: dict[str, Any],
                                                                   compiled: list[str]) -> None:
    result = run(tmp_path, GPT, f"{SMALL} --max_iters=20", knobs)
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"] == compiled  # the trial's scope, not the script's own torch.compile(model)
    assert result["windows"] == 2 and len(result["step_s_windows"]) == 2 and result["step_s"] > 0
    assert len(result["step_cpu_s_windows"]) == 2 and min(result["step_cpu_s_windows"]) > 0
    assert result["throughput_unit"] == "tokens"
    # 2 sequences of 16 tokens per micro-step, 2 micro-steps per optimizer step (its own accumulation), 1 rank:
    # each window's rate exactly 64 tokens over its step time.
    assert_rates(result, 2 * 16 * 2 * 1)
    assert len(result["losses"]) == NEEDED  # one per optimizer step: the scalars it called backward() on
    assert result["script"]["optimizer_steps"] == NEEDED  # ended right after the timed part, not at max_iters
    assert result["script"]["compile_calls"][0]["target"] == "GPT"
    # Peak memory read as the worker reads it: reset after the warm-up (CPU RSS cannot be, and says so).
    timeline = result["timeline"]
    assert timeline["warmup_done"] <= timeline["memory_reset"] <= timeline["timed_done"]
    assert result["memory_source"].startswith("ru_maxrss") and result["warmup_peak_memory_bytes"] > 0
    if compiled:
        assert result["compiled_coverage"] == 1.0 and result["fingerprint"] != "eager:script"
        assert result["graph_count"] >= 1
    else:
        assert result["graph_count"] == 0  # the eager baseline: the script's torch.compile(model) did nothing
    stdout = (tmp_path / "trial" / "stdout.log").read_text()
    assert "step 0: val loss" in stdout and "step 20" not in stdout  # its eval at step 0 ran; it stopped early


@pytest.mark.integration
def test_the_eager_run_and_a_compiled_run_see_the_same_losses(tmp_path: Path) -> None:
    """The numerics reference of a script is its eager run: same seed, same data, so the losses agree."""
    eager = run(tmp_path / "a", GPT, f"{SMALL} --max_iters=20 --dtype=float32", {"compile.scope": "none"})
    compiled = run(tmp_path / "b", GPT, f"{SMALL} --max_iters=20 --dtype=float32",
                   {"compile.scope": "module", "compile.backend": "eager"})
    assert eager["losses"] == pytest.approx(compiled["losses"], rel=1e-4)


@pytest.mark.integration
def test_a_two_rank_ddp_script_is_measured_on_every_rank_and_ends_cleanly(tmp_path: Path) -> None:
    """torch.compile(model) then DDP(model), accumulation under require_backward_grad_sync: the ranks agree on
    every window (a collective per window), rank 0 writes the result, and every rank exits at the barrier."""
    result = run(tmp_path, GPT, f"{SMALL} --max_iters=20",
                 {"compile.scope": "module", "compile.backend": "aot_eager", "ddp.optimize": "no_optimization"},
                 nproc=2)
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2 and result["compiled"] == ["model"]
    # Each rank's 2 sequences of 16 tokens, 1 micro-step each (the script divides accumulation by world size),
    # on both ranks: exactly 64 tokens per optimizer step in every window.
    assert_rates(result, 2 * 16 * 1 * 2)
    assert len(result["losses"]) == NEEDED  # ended at the barrier, not killed: the launch returned ok


BAD = {
    "crashes": ("""
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(100):
            if i == 1:
                raise ValueError("the data loader ran dry")
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        """, "exception", "ValueError: the data loader ran dry"),
    "never_steps": ("""
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built, then an update by hand instead
        for i in range(20):
            model(torch.randn(8, 4)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
        """, "script_ended", "the script built an optimizer but never stepped it (torch.optim.Optimizer.step): "
        "step it, or build none"),
    "stops_early": ("""
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        """, "script_ended",
        f"the script stopped after 3 optimizer steps; the measurement needs {NEEDED}: raise its step budget"),
    # It ends itself with an error (argparse's usage error: exit code 2) before a step: its own words, not only
    # "never called backward()" (pytorch/examples' dcgan/main.py without its required --dataset).
    "exits_on_its_arguments": ("""
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--dataset", required=True)
        parser.parse_args()
        """, "script_ended", "the script exited with code 2: exits_on_its_arguments.py: error: the following "
        "arguments are required: --dataset (the script never called backward() nor stepped an optimizer"),
    # It ends itself cleanly before a step, saying why on its stdout (pytorch/examples' FSDP2 example on a machine
    # without 2 GPUs): its words, not only "never called backward()".
    "exits_saying_why": ("""
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        exit()
        """, "script_ended", "the script ended before its first training step, its last line: Unable to locate "
        "sufficient 2 gpus to run this example. Exiting. (the script never called backward()"),
    # Its training in mp.spawn children, which would run the whole job where no agent is: refused as it spawns.
    "spawns_its_training": ("""
        import torch.multiprocessing as mp

        def train(rank):
            model = torch.compile(torch.nn.Linear(4, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for i in range(20):
                model(torch.randn(8, 4)).sum().backward()
                opt.step()

        if __name__ == "__main__":
            mp.spawn(train, nprocs=1)
        """, "cannot_take_over", "the script starts its training in torch.multiprocessing.spawn children, which the "
        "agent does not reach: start its ranks with torchrun instead (script.launcher=torchrun"),
    # No torch.compile, and no module to find (a script with one does: tests/test_script_steps.py).
    "never_compiles": ("""
        weight = torch.nn.Parameter(torch.randn(4, 1))
        opt = torch.optim.SGD([weight], lr=0.1)
        for i in range(20):
            (torch.randn(8, 4) @ weight).sum().backward()
            opt.step()
        """, "nothing_compiled", "never called torch.compile on a model, and no module it calls owns its optimizer's"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_script_is_a_failed_trial_with_a_one_line_reason(tmp_path: Path, name: str) -> None:
    body, failure, reason = BAD[name]
    script = script_file(tmp_path, name, body)
    result = run(tmp_path, script, "", {"compile.scope": "module", "compile.backend": "eager"})
    assert (result["status"], result["failure"]) == ("failed", failure), result.get("reason")
    assert reason in result["reason"] and "\n" not in result["reason"]
    assert json.loads((tmp_path / "trial" / "result.json").read_text())["failure"] == failure


def test_what_a_trial_leaves_in_its_temporary_directory_goes_with_it(tmp_path: Path) -> None:
    # Killed trials left multiprocessing's pymp-* directories in /tmp (the spawning script above, 2 per test run).
    seen = tmp_path / "tmpdir.txt"
    script = script_file(tmp_path, "litters", f"""
        import pathlib, tempfile
        left = tempfile.mkdtemp(prefix="pymp-")  # as a killed multiprocessing parent leaves it
        pathlib.Path({str(seen)!r}).write_text(left)
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(20):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        """)
    result = run(tmp_path, script, "", {"compile.scope": "none"})
    assert result["status"] == "ok", result.get("reason")
    left = Path(seen.read_text())
    assert left.parent.parent == Path(tempfile.gettempdir()) and left.parent.name.startswith("autocompile-")
    assert not left.parent.exists()


def test_a_killed_tuners_temporary_directories_go_with_the_next_launch() -> None:
    # A tuner killed with SIGKILL never reaches its launches' cleanup: the next tuner's first launch removes them.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now (reused, the directory is left: never another process's)
    dead = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{gone.pid}-"))
    (dead / "pymp-left").mkdir()
    alive = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getppid()}-"))  # a tuner still running
    try:
        fresh = Path(scratch_dir())
        assert fresh.is_dir() and fresh.name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-")
        assert not dead.exists() and alive.is_dir()
    finally:
        for path in (dead, alive, fresh):
            shutil.rmtree(path, ignore_errors=True)


FUNCTIONS = {
    # The whole train step compiled with a decorator (the backward and the optimizer step break the graph).
    "decorated_step": ("""
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        @torch.compile(mode="max-autotune")
        def train_step(x):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()

        for i in range(20):
            train_step(torch.randn(8, 4))
        """, "function train_step", 1.0),
    # A compiled loss beside an eager model: only the loss is the script's compiled region.
    "compiled_loss": ("""
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn = torch.compile(lambda y: (y.float() ** 2).mean())
        for i in range(20):
            loss_fn(model(torch.randn(8, 4))).backward()
            opt.step()
            opt.zero_grad()
        """, "function <lambda>", 0.0),
    # A bound forward compiled in place of the module.
    "compiled_forward": ("""
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model.forward = torch.compile(model.forward)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(20):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        """, "function Sequential.forward", 1.0),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_function_the_script_compiles_is_compiled_with_the_trials_knobs(tmp_path: Path, name: str) -> None:
    # Refused for every compiled trial before: now it is the script's own region, compiled with the trial's
    # backend in place of the script's arguments (max-autotune on CPU would fail here), eager under scope none.
    body, compiled, cover = FUNCTIONS[name]
    script = script_file(tmp_path, name, body)
    result = run(tmp_path, script, "", {"compile.scope": "module", "compile.backend": "aot_eager"})
    assert result["status"] == "ok", result.get("reason")
    assert result["compiled"] == [compiled] and result["compiled_coverage"] == cover
    assert not result["fingerprint"].startswith("eager")
    eager = run(tmp_path, script, "", {"compile.scope": "none"})
    assert eager["status"] == "ok" and eager["compiled"] == [] and eager["fingerprint"].startswith("eager")


def test_one_process_runs_as_python_starts_it_and_a_budget_ending_mid_precision_keeps_its_windows(
        tmp_path: Path) -> None:
    """nanoGPT's train.py takes RANK as "launched by torchrun: DDP on cuda:LOCAL_RANK", so a one-process script
    starts with plain python (``script.launcher=auto``); and a script whose steps end while the timed part
    still chases ``measure.precision`` is measured on the windows it ran (as ``measure.max_timed_s`` would)."""
    script = tmp_path / "single.py"
    script.write_text(textwrap.dedent("""
        import os, torch
        if "RANK" in os.environ:
            raise SystemExit("torchrun's RANK: this script would take its DDP branch")
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(12):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
        """))
    chasing = MeasureSettings(warmup_steps=2, windows=2, window_steps=2, precision=1e-9, max_timed_s=600,
                              timeout_s=240)
    result = run(tmp_path, script, "", {"compile.scope": "module", "compile.backend": "eager"}, measure=chasing)
    assert result["status"] == "ok", result.get("reason")
    assert result["windows"] == 5  # 2 warm-up steps, then 5 whole windows of 2 in the script's 12 steps
    assert "torch.distributed.run" not in (tmp_path / "trial" / "cmd.txt").read_text()


def test_a_hanging_script_is_killed_at_its_timeout_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "hangs_forever.py"
    script.write_text("import time\ntime.sleep(600)\n")
    measure = MeasureSettings(warmup_steps=2, windows=2, window_steps=2, precision=0.0, timeout_s=4)
    result = run(tmp_path, script, "", {"compile.scope": "none"}, measure=measure)
    assert (result["status"], result["failure"]) == ("failed", "timeout")
    assert survivors("hangs_forever.py") == []


def test_the_agent_stays_out_of_processes_that_do_not_run_the_script(tmp_path: Path) -> None:
    """torchrun's own process and inductor's compile workers inherit the variables: only the script is patched."""
    import subprocess
    import sys

    spec = script_spec(GPT, SMALL, {"compile.scope": "none"})
    trial = tmp_path / "trial"
    trial.mkdir()
    spec.write(trial)
    env = {**spec.environment(trial, {"PYTHONPATH": str(ROOT)}), "PATH": "/usr/bin:/bin"}
    probe = "import sys, torch; print(torch.compile.__module__, 'autocompile.trial.script.agent' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["torch", "False"]


def test_a_sitecustomize_the_agent_shadows_still_runs(tmp_path: Path) -> None:
    """ddtrace-run, a distribution's or a cluster's own sitecustomize: the agent's runs it, then steps aside."""
    import subprocess
    import sys

    spec = script_spec(GPT, SMALL, {"compile.scope": "none"})
    trial, theirs = tmp_path / "trial", tmp_path / "theirs"
    trial.mkdir()
    theirs.mkdir()
    spec.write(trial)
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    env = {**spec.environment(trial, {"PYTHONPATH": f"{theirs}:{ROOT}"}), "PATH": "/usr/bin:/bin"}
    probe = "import os; print(os.environ.get('THEIR_SITECUSTOMIZE'))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["ran"]


def test_a_script_trial_offers_only_the_knobs_its_agent_reaches() -> None:
    env = script_env("cpu", 2)
    with pytest.raises(KnobError, match=r"amp\.dtype='bfloat16' does not apply.*autocompile\.apply"):
        TrialConfig.from_flat({"amp.dtype": "bfloat16"}, env)
    with pytest.raises(KnobError, match=r"compile\.scope='train_step' is not valid"):
        TrialConfig.from_flat({"compile.scope": "train_step"}, env)
    active = TrialConfig.from_flat({"compile.scope": "module"}, env).active(env)
    assert {"ddp.optimize", "compile.mode", "compile.dynamic", "compile.fullgraph"} <= set(active)
    assert not {"amp.dtype", "ac.policy", "optim.impl", "ddp.wrap_order", "parallel.strategy",
                "placement.order", "compile.optimizer"} & set(active)
