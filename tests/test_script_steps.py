"""What a step of the user's script is, and what its timing leaves out: scripts as they are written in the wild
(a whole-module ``torch.save``, an update by hand, a GradScaler that skips, a second optimizer, an evaluation
before training, a loader that bounds the speed), each run by the real path under the agent (tiny models,
eager/aot_eager backends)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from autocompile.config.spec import MeasureSettings
from tests.conftest import assert_rates, launched
from tests.test_script import NEEDED, run, script_file, script_spec

BATCH = 8
COMPILED = {"compile.scope": "module", "compile.backend": "eager"}


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import copy, io, pickle, time\nimport torch\n" + textwrap.dedent(body))
    return path


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["status"] == "ok", result.get("reason")
    return result


# A real script trial each (9-10 s): the eager baseline is integration (default run: compiled, where the agent also
# takes the script's torch.compile over).
@pytest.mark.parametrize("knobs", [pytest.param({"compile.scope": "none"}, marks=pytest.mark.integration), COMPILED],
                         ids=["eager", "compiled"])
def test_the_scripts_model_and_optimizer_stay_saveable_under_a_trial(tmp_path: Path, knobs: dict[str, Any]) -> None:
    """pytorch/examples' word_language_model does torch.save(model, f): the agent's hooks pickle to nothing."""
    path = script(tmp_path, f"""
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

        model = torch.compile(Net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn({BATCH}, 4)
        for i in range(40):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if i == 3:
                with open({str(tmp_path / "model.pt")!r}, "wb") as f:
                    torch.save(model, f)
                loaded = torch.load({str(tmp_path / "model.pt")!r}, weights_only=False)
                twin = copy.deepcopy(model)
                pickle.loads(pickle.dumps(model))
                torch.save(opt, io.BytesIO())
                copy.deepcopy(opt)
                with torch.no_grad():
                    assert torch.equal(loaded(x), twin(x))
                assert not loaded._forward_pre_hooks and not twin._forward_pre_hooks  # copies are not measured
                assert model._forward_pre_hooks  # the script's own model still is
        """)
    result = ok(run(tmp_path, path, "", knobs))
    assert_rates(result, BATCH)


def test_a_script_that_never_compiles_has_the_model_owning_its_optimizers_parameters_compiled(tmp_path: Path) -> None:
    """A plain training script (no torch.compile anywhere): the trial compiles the module it calls whose parameters
    its optimizer steps, in place at the first step, and the script's own objects stay as they were to save."""
    path = script(tmp_path, f"""
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.out = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

            def forward(self, x):
                return self.out(torch.relu(self.fc(x)))

        model = Net()
        probe = torch.nn.Linear(4, 1)  # called too, but the optimizer does not step it
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(40):
            x = torch.randn({BATCH}, 4)
            probe(x)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        torch.save(model, io.BytesIO())
        """)
    result = ok(run(tmp_path, path, "", COMPILED))
    assert result["compiled"] == ["model"] and result["compiled_coverage"] == 1.0 and result["graph_count"] >= 1
    (call,) = result["script"]["compile_calls"]
    assert call["target"] == "Net" and "owning SGD's parameters (no torch.compile)" in call["where"]
    assert_rates(result, BATCH)


GAN = """
    class Generator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

        def forward(self, z):
            return self.net(z)

    class Discriminator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8),
                                           torch.nn.ReLU(), torch.nn.Linear(8, 1))

        def forward(self, x):
            return self.net(x)

    G, D = Generator(), Discriminator()
    COMPILE
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
    bce = torch.nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)
    for i in range(60):
        real, z = torch.randn(BATCH, 4), torch.randn(BATCH, 8)
        fake = G(z)
        opt_d.zero_grad()
        (bce(D(real), ones) + bce(D(fake.detach()), zeros)).backward()
        opt_d.step()  # the discriminator's optimizer steps first
        opt_g.zero_grad()
        bce(D(fake), ones).backward()
        opt_g.step()
    """


@pytest.mark.parametrize("compile_call", ["", "D = torch.compile(D)"], ids=["no_compile_call", "only_D_compiled"])
def test_a_gan_has_every_stepped_optimizers_module_compiled_and_counted(tmp_path: Path, compile_call: str) -> None:
    """A GAN as people write it (two Adams, both stepped each iteration): with no torch.compile, the modules
    owning both optimizers' parameters are compiled; the coverage counts both optimizers' weights, so a script
    that compiles only its discriminator reads about one half (G 420 weights, D 433), not 100 %."""
    path = script(tmp_path, GAN.replace("BATCH", str(BATCH)).replace("COMPILE", compile_call))
    result = ok(run(tmp_path, path, "", COMPILED))
    calls = result["script"]["compile_calls"]
    if compile_call:
        assert [c["target"] for c in calls] == ["Discriminator"]
        assert result["compiled_coverage"] == pytest.approx(433 / (420 + 433))
    else:
        assert sorted(c["target"] for c in calls) == ["Discriminator", "Generator"]
        assert all("(no torch.compile)" in c["where"] for c in calls)
        assert result["compiled_coverage"] == 1.0 and len(result["compiled"]) == 2


def test_a_hand_written_update_with_no_compile_call_has_its_model_compiled(tmp_path: Path) -> None:
    """pytorch/examples' word_language_model: no optimizer object (p.data.add_(p.grad, alpha=-lr)), no compile
    call, a parameterless loss module called beside the model: the module whose weights backward() filled is
    compiled, in place."""
    path = script(tmp_path, f"""
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        criterion = torch.nn.MSELoss()
        for i in range(40):
            model.zero_grad()
            criterion(model(torch.randn({BATCH}, 4)), torch.zeros({BATCH}, 1)).backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
        """)
    result = ok(run(tmp_path, path, "", COMPILED))
    (call,) = result["script"]["compile_calls"]
    assert call["target"] == "Sequential" and "backward() filled" in call["where"]
    assert result["compiled_coverage"] == 1.0 and result["graph_count"] >= 1
    assert result["script"]["step"] == "backward"


def test_a_hand_written_update_with_no_optimizer_steps_at_each_backward(tmp_path: Path) -> None:
    path = script(tmp_path, f"""
        model = torch.compile(torch.nn.Linear(4, 1))
        for i in range(40):
            model(torch.randn({BATCH}, 4)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.01)
                    p.grad = None
        """)
    result = ok(run(tmp_path, path, "", COMPILED))
    assert result["script"]["step"] == "backward" and result["script"]["optimizer_steps"] == NEEDED
    assert_rates(result, BATCH)
    assert len(result["losses"]) == NEEDED


def test_a_gradscaler_step_that_skips_its_optimizer_is_still_a_step(tmp_path: Path) -> None:
    """inf gradients every third iteration: scaler.step(opt) skips opt.step(), yet the iteration ran."""
    path = script(tmp_path, f"""
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        skipped = 0
        for i in range(40):
            loss = model(torch.randn({BATCH}, 4)).sum()
            if i % 3 == 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scale = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < scale
            opt.zero_grad()
            assert skipped == (i + 2) // 3, (i, skipped)  # the skips this test is about did happen
        """)
    result = ok(run(tmp_path, path, "", COMPILED))
    assert result["script"]["optimizer_steps"] == NEEDED
    assert_rates(result, BATCH)  # every window: exactly its iterations' samples, skipped ones counted


def test_the_step_is_the_optimizer_stepped_every_iteration_not_the_first_to_step(tmp_path: Path) -> None:
    """An auxiliary optimizer stepped every third iteration, before the main one: the main one's steps count."""
    path = script(tmp_path, f"""
        model = torch.compile(torch.nn.Linear(4, 2))
        head = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        aux = torch.optim.SGD(head.parameters(), lr=0.01)
        for i in range(60):
            head(model(torch.randn({BATCH}, 4))).sum().backward()
            if i % 3 == 0:
                aux.step()
                aux.zero_grad()
            opt.step()
            opt.zero_grad()
        """)
    result = ok(run(tmp_path, path, "", COMPILED))
    assert result["script"]["step"] == "optimizer" and result["script"]["optimizer_steps"] == NEEDED
    assert_rates(result, BATCH)


def test_an_evaluation_before_the_first_step_is_not_compile_time(tmp_path: Path) -> None:
    """nanoGPT evaluates at step 0, before training: its 2 s are measured apart, not charged to compile."""
    path = script(tmp_path, f"""
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(40):
            if i == 0:
                with torch.no_grad():
                    model(torch.randn({BATCH}, 4))
                time.sleep(2.0)
            model(torch.randn({BATCH}, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        """)
    result = ok(run(tmp_path, path, "", {"compile.scope": "none"}))
    assert result["compile_s"] < 1.0, result["warmup_step_s"]
    assert result["script"]["excluded_before_first_step_s"] >= 2.0
    assert result["script"]["before_first_step_s"] >= result["script"]["excluded_before_first_step_s"]


LOADER_BOUND = """
    from torch.utils.data import DataLoader

    def collate(batch):
        time.sleep(0.05)  # the loader is the bottleneck: one worker, 50 ms a batch
        return torch.stack(batch)

    if __name__ == "__main__":
        data = [torch.randn(4) for _ in range(8 * 400)]
        loader = DataLoader(data, batch_size=8, num_workers=1, prefetch_factor=4, collate_fn=collate)
        model = torch.compile(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    """


def test_a_loader_bound_script_runs_as_fast_compiled_as_eager(tmp_path: Path) -> None:
    """The loader's worker fills its queue (4 batches) while the candidate compiles: the warm-up drains it, so
    the windows time the loader's steady pace in both (undrained, the compiled windows ran several times faster)."""
    path = script(tmp_path, LOADER_BOUND)
    measure = MeasureSettings(warmup_steps=1, windows=3, window_steps=2, precision=0.0, timeout_s=240)
    eager = ok(run(tmp_path / "eager", path, "", {"compile.scope": "none"}, measure=measure))
    compiled = ok(run(tmp_path / "compiled", path, "", {"compile.scope": "module", "compile.backend": "aot_eager"},
                      measure=measure))
    for result in (eager, compiled):
        assert result["script"]["loader_bound"] and result["script"]["loader_queue_drained_steps"] == 4
        assert_rates(result, BATCH)
    ratio = compiled["tokens_per_s"] / eager["tokens_per_s"]
    assert 0.75 < ratio < 1.33, (ratio, eager["tokens_per_s_windows"], compiled["tokens_per_s_windows"])


def test_a_recompile_limit_the_job_would_live_with_runs_on_and_is_said(tmp_path: Path) -> None:
    """An evaluation under no_grad is one recompile past the script's limit: under plain torch its calls run eager
    and training goes on compiled. The trial measures that job (it used to fail with FailOnRecompileLimitHit) and
    lists the hit, with dynamo's last guard failure."""
    path = script(tmp_path, f"""
        torch._dynamo.config.recompile_limit = 1  # the script's own limit: its evaluation's graph is one too many
        model = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(60):
            x = torch.randn({BATCH}, 4)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if i % 3 == 2:
                with torch.no_grad():
                    model(x)
        """)
    result = ok(run(tmp_path, path, "", {"compile.scope": "module", "compile.backend": "aot_eager"}))
    assert result["compiled_coverage"] == 1.0  # training stayed compiled
    (hit,) = set(result["script"]["recompile_limit_hits"])
    assert hit.startswith("hit config.recompile_limit (1)") and "last reason" in hit


def test_the_input_shapes_the_timing_covered_and_what_the_study_may_offer_are_said(tmp_path: Path) -> None:
    """A curriculum that lengthens its sequences at step 10 is timed before it does (the trial ends after 6 steps):
    the result says which shapes the windows timed, apart from the warm-up's; and what its study's space reads
    (tests/test_script_reference.py): two backward() calls a step (accumulation), a model with no repeated blocks."""
    path = script(tmp_path, f"""
        model = torch.compile(torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(40):
            for micro in range(2):
                ids = torch.randint(0, 64, ({BATCH}, 8 if i < 10 else 32))
                torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
        """)
    found = ok(run(tmp_path, path, "", COMPILED))["script"]
    assert found["input_shapes"] == {"warmup": {f"{BATCH}x8": 4}, "timed": {f"{BATCH}x8": 2 * (NEEDED - 2)}}
    assert found["backwards_per_step"] == 2 and found["structure"]["has_blocks"] is False


UNSEEDED = """
    model = torch.nn.Linear(4, 1)
    for i in range(40):  # draws its data unseeded; its update by hand (no optimizer, no torch.compile)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(32, 4)), torch.randn(32, 1)).backward()
        for p in model.parameters():
            p.data.add_(-0.1 * p.grad)
    """


def test_an_eager_and_a_compiled_trial_of_an_unseeded_script_see_the_same_numbers_in_the_same_unit(
        tmp_path: Path) -> None:
    # pytorch/examples' regression/main.py: unseeded, every trial of it was infeasible (its losses differed from
    # the reference's by the draws alone), and its eager trial counted backward() calls where the compiled ones
    # counted samples (the finder ran only when compiling).
    import dataclasses

    script = script_file(tmp_path, "unseeded", UNSEEDED)
    eager = launched(tmp_path / "eager", script_spec(script, "", {"compile.scope": "none"}))
    compiled = launched(tmp_path / "compiled", script_spec(script, "", {"compile.scope": "module",
                                                                        "compile.backend": "eager"}))
    for result in (eager, compiled):
        assert result["status"] == "ok", result.get("reason")
    assert eager["losses"] == pytest.approx(compiled["losses"], rel=1e-5)
    assert eager["throughput_unit"] == compiled["throughput_unit"] == "samples"
    assert eager["script"]["structure"] is not None and eager["script"]["compile_calls"] == []  # found, not taken
    spec = script_spec(script, "", {"compile.scope": "none"})
    unseeded = launched(tmp_path / "unseeded", dataclasses.replace(spec, script=dataclasses.replace(spec.script,
                                                                                                    seed=None)))
    assert unseeded["losses"][0] != eager["losses"][0]  # script.seed=null: the draws differ
