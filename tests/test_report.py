"""The report's outputs that users run: the "measure it again" command and best_config.py."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autocompile.app import available_models
from autocompile.config.commands import hydra_value, measure_command
from autocompile.config.knobs import KNOBS, TrialConfig
from autocompile.config.settings import Settings, register, settings_from
from autocompile.config.space import SearchSpace
from autocompile.report.export.snippet import snippet
from autocompile.report.findings.entry import Entry
from autocompile.study.records.record import Measurement

ROOT = Path(__file__).resolve().parent.parent
Compose = Callable[..., Settings]


@pytest.fixture
def settings_for() -> Iterator[Compose]:
    """Settings exactly as the command line would compose them (no subprocess)."""
    from hydra import compose, initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield lambda *overrides: settings_from(compose("config", overrides=list(overrides)), available_models())


def composed_back(settings_for: Compose, command: str) -> Settings:
    """What running the printed command would measure: parsed as a shell does, composed as Hydra does."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "autocompile"], command
    return settings_for(*argv[3:])


def winner(settings: Settings, knobs: dict[str, Any]) -> dict[str, Any]:
    """A trial's recorded configuration: every active knob, as the tuner stores it."""
    return TrialConfig.from_flat(knobs, settings.env).active(settings.env)


def non_default(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if v != KNOBS[k][1]}


@pytest.mark.parametrize("overrides", [
    ("+model=gpt2-tiny", "model.n_layer=3", "measure.windows=7", "workload.seq_len=[16,32]"),
    ("+model=gpt2-tiny", "workload.nnodes=2", "workload.nproc_per_node=2", "workload.threads=1",
     "workload.optimizer.lr=0.001", "workload.seed=5", "workload.batch_size=3", "measure.cache=warm",
     "measure.timeout_s=60", "output_root=/tmp/a b"),
    ("+model=gpt2-tiny", "model.name=mine", "~model.n_positions", "+model.n_inner=128"),
    ("+model=gpt2", "workload=varlen"),
    ("+model=gpt2", "workload.seq_len=[128]"),  # the default workload's length, not GPT-2's own
    ("+model=llama", "workload.batch_size=2"),
    ("+model=bert-tiny", "workload.grad_accum_steps=2", "workload.grad_clip_norm=1.0"),  # its config sets the data
    ("+model=gpt2-tiny", "workload.optimizer._target_=torch.optim.SGD", "+workload.optimizer.momentum=0.9",
     "workload.lr_schedule._target_=torch.optim.lr_scheduler.StepLR", "+workload.lr_schedule.step_size=3"),
    ("+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64", "+model.block_sleep_s=0.005",
     "+model.behaviour=ok"),
    # Strings that must stay strings, quotes, spaces and a literal ${...} survive both quotings.
    ("+model=custom", "model._target_=tests.models.tiny_lm_with_extras", "model.vocab_size=64", "model.name=tiny lm",
     '+model.note="it\'s \\${not} a \\"ref\\""', '+model.flag="true"', '+model.count="12"'),
])
def test_measure_command_composes_back_to_the_same_workload(settings_for: Compose,
                                                           overrides: tuple[str, ...]) -> None:
    settings = settings_for("workload.device=cpu", *overrides)
    config = winner(settings, {"compile.scope": "regional", "amp.dtype": "bfloat16", "compile.backend": "eager"})
    command = measure_command(settings, config)
    again = composed_back(settings_for, command)
    assert again.task == "measure"
    assert again.model == settings.model
    assert type(again.model.kwargs.get("flag", "")) is str
    assert again.workload == settings.workload
    assert again.measure == settings.measure
    assert again.output_root == settings.output_root
    assert again.fixed_knobs == non_default(config)


@pytest.mark.parametrize(("model", "seq_len"), [
    ("gpt2", [1024]), ("llama", [2048]), ("bert", [512]), ("gpt2-tiny", [128]), ("llama-tiny", [128]),
    ("bert-tiny", [128])])
def test_each_model_trains_at_its_usual_shape_unless_the_command_says_otherwise(
        settings_for: Compose, model: str, seq_len: list[int]) -> None:
    assert settings_for(f"+model={model}", "workload.device=cpu").workload.seq_len == seq_len
    assert settings_for(f"+model={model}", "workload.device=cpu", "workload.seq_len=[64]").workload.seq_len == [64]
    assert settings_for(f"+model={model}", "workload.device=cpu", "workload=varlen").workload.seq_len == [96, 128]
    # Only the shape: the rest of the workload is the default one (bert keeps its masked-token data).
    assert settings_for(f"+model={model}", "workload.device=cpu").workload.batch_size == 8


def test_vit_trains_on_224_pixel_images_and_its_tiny_variant_on_32(settings_for: Compose) -> None:
    assert settings_for("+model=vit", "workload.device=cpu").model.kwargs["image_size"] == 224
    assert settings_for("+model=vit-tiny", "workload.device=cpu").model.kwargs["image_size"] == 32


def test_measure_command_says_only_what_differs_and_names_the_composed_model(settings_for: Compose) -> None:
    settings = settings_for("+model=gpt2-tiny", "model.n_layer=3", "measure.windows=7", "workload.seq_len=[16,32]",
                            "workload.device=cpu")
    args = shlex.split(measure_command(settings, winner(settings, {"compile.scope": "regional"})))
    assert args[3] == "+model=gpt2-tiny"
    for arg in ("model.n_layer=3", "measure.windows=7", "workload.seq_len=[16,32]", "task=measure",
                "workload.device=cpu", "compile.scope=regional"):
        assert arg in args
    assert not any(a.startswith(("model.n_embd", "measure.warmup_steps", "workload.batch_size", "workload.optimizer"))
                   for a in args)
    custom = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64",
                          "workload.device=cpu")
    args = shlex.split(measure_command(custom, winner(custom, {})))
    assert args[3:6] == ["+model=custom", "model._target_=tests.models.tiny_lm", "model.vocab_size=64"]
    assert not any(a.startswith("model.name") for a in args)  # custom names the model after its factory


def test_inside_a_hydra_job_the_command_keeps_the_model_option_the_user_chose(
        settings_for: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    overrides = ["+model=gpt2-tiny", "model.name=mine", "workload.device=cpu"]
    settings = settings_for(*overrides)
    # A renamed model matches no config by name alone; the tuner runs inside the Hydra job, which knows.
    assert shlex.split(measure_command(settings, winner(settings, {})))[3] == "+model=custom"
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    HydraConfig.instance().set_config(compose("config", overrides=overrides, return_hydra_config=True))
    command = measure_command(settings, winner(settings, {}))
    assert shlex.split(command)[3:5] == ["+model=gpt2-tiny", "model.name=mine"]
    assert composed_back(settings_for, command).model == settings.model


def test_measure_command_pins_the_threads_a_trial_slot_ran_with(settings_for: Compose) -> None:
    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu")
    config = winner(settings, {})
    assert "workload.threads" not in measure_command(settings, config, threads=settings.threads)
    slot_threads = settings.threads + 1
    again = composed_back(settings_for, measure_command(settings, config, threads=slot_threads))
    assert again.threads == slot_threads


@pytest.mark.parametrize("value", [
    None, True, False, 3, 0.0003, 1e-05, "max-autotune", "true", "Null", "12", "1e5", "nan", "a b", "it's",
    'say "hi"', "both ' and \"", "${x}", "back\\slash\\", "-lead", [16, 32], {"a": 1, "b": ["x y", None]},
])
def test_hydra_value_reads_back_as_the_same_value_and_type(settings_for: Compose, value: Any) -> None:
    from hydra import compose
    from omegaconf import OmegaConf

    cfg = compose("config", overrides=["+model=gpt2-tiny", f"+model.v={hydra_value(value)}"])
    back = OmegaConf.to_container(cfg.model, resolve=True)["v"]
    assert back == value and type(back) is type(value)


def best_entry(settings: Settings, knobs: dict[str, Any]) -> Entry:
    measured = Measurement(status="ok", tokens_per_s=1e5, step_s=0.01, compile_s=3.0, environment={"threads": 1})
    return Entry(4, "", winner(settings, knobs), None, measured, 4.0, None)


def test_multi_gpu_snippet_puts_each_rank_on_its_own_gpu(settings_for: Compose,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    composed = settings_for("+model=gpt2-tiny", "workload.device=cpu", "workload.nproc_per_node=2", "workload.seed=7")
    settings = dataclasses.replace(composed, device="cuda")  # as composed on a 2-GPU machine
    text = snippet(settings, best_entry(settings, {"compile.scope": "module"}), SearchSpace(settings.env, {}, False))
    code = compile(text, "best_config.py", "exec")
    assert "torch.cuda.set_device(local)" in text and 'f"cuda:{local}"' in text
    # NCCL binds a rank to the current device when the group starts: the device is set first.
    assert text.index("device = local_device()") < text.index('init_process_group("nccl")')
    assert "SEED = 7" in text and "manual_seed(SEED)" in text and "seed=SEED" in text
    assert "manual_seed(0)" not in text and "seed=0" not in text

    # Rank 1 of a torchrun job: its step is built on cuda:1, after set_device(1).
    namespace: dict[str, Any] = {"__name__": "best_config"}
    exec(code, namespace)
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    namespace["apply"] = lambda *args, device, **kwargs: calls.append(("apply", device))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    namespace["build_step"](torch.nn.Linear(2, 2), None)
    assert calls == [("set_device", 1), ("apply", "cuda:1")]


def test_a_cpu_snippet_runs_at_the_threads_its_trials_ran_with(settings_for: Compose) -> None:
    """Inductor's CPU cache key holds the thread count: best_config.py sets it before building (and says so when
    a caller's process has another), or its warm start misses every graph."""
    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu")
    text = snippet(settings, best_entry(settings, {"compile.scope": "module"}), SearchSpace(settings.env, {}, False))
    compile(text, "best_config.py", "exec")
    assert "THREADS = 1\n" in text and "torch.set_num_threads(THREADS)" in text
    assert "set OMP_NUM_THREADS={THREADS}" in text


def test_single_process_cpu_snippet_stays_plain_and_uses_the_study_seed(settings_for: Compose) -> None:
    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu", "workload.seed=3")
    text = snippet(settings, best_entry(settings, {"compile.scope": "regional"}), SearchSpace(settings.env, {}, False))
    compile(text, "best_config.py", "exec")
    assert "LOCAL_RANK" not in text and "set_device" not in text and "init_process_group(" not in text
    assert "SEED = 3" in text and "device=DEVICE" in text
    command = text.split("Measure it again:", 1)[1].splitlines()[0].strip()
    assert shlex.split(command)[3] == "+model=gpt2-tiny"
