"""The winner in the user's framework: each exported file parses and the framework's own loader accepts it
(Accelerate's config loader and launcher, ``TrainingArguments``, torchtitan's documented keys), it carries the
winner's settings, and it names what the framework cannot express with the study's measured cost."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, get_args

import pytest
import yaml

from autocompile.config.knobs import KNOBS, Env, TrialConfig
from autocompile.report.export.frameworks import (
    accelerate_gaps,
    accelerate_yaml,
    trainer_json,
    winner_of,
    write_framework_configs,
)
from autocompile.report.export.gaps import Winner, measured_cost
from autocompile.report.export.torchtitan import torchtitan_gaps, torchtitan_toml
from autocompile.report.findings.entry import Entry
from autocompile.study.records.record import Measurement
from autocompile.study.statistics.effect import Effect

if sys.version_info >= (3, 11):
    import tomllib
else:  # the GPU machines run 3.12; 3.10 reads TOML with tomli
    tomllib = pytest.importorskip("tomli")

WORKLOAD = {"batch_size": 4, "seq_len": [32], "grad_clip_norm": 1.0, "grad_accum_steps": 1,
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.001}}
MODES = ("default", "lite", "max-autotune-no-cudagraphs")


def active(values: dict[str, Any], env: Env) -> dict[str, Any]:
    """A winner's recorded configuration (its active knobs, as the tuner stores it). Knobs this table does
    not have yet (the FSDP2 knobs land in another branch) are passed through as given."""
    known = {k: v for k, v in values.items() if k in KNOBS}
    return TrialConfig.from_flat(known, env).active(env) | {k: v for k, v in values.items() if k not in KNOBS}


def make_winner(values: dict[str, Any], world_size: int = 1, effects: list[Effect] | None = None) -> Winner:
    env = Env(device="cpu", world_size=world_size, modes=MODES, memory_budget=True)
    return Winner(active(values, env), effects or [], device="cpu", world_size=world_size, workload=WORKLOAD,
                  study="s", trial=7)


COMPILED_OPTIMIZER = Effect("compile.optimizer", "", True, False, 0.041, 0.01, -2.0, 3, True, basis="verdict",
                            low=0.02, high=0.06, how="interleaved rounds (fresh processes)")
# Measured in the search from the framework's value (False) to the winner's (True): 20% slower steps without it.
COMPILED_AUTOGRAD = Effect("compile.compiled_autograd", "", False, True, -1 / 6, 0.02, 5.0, 2, True)

WINNERS = {
    "eager": make_winner({"compile.scope": "none"}),
    "regional_ac_bf16": make_winner({
        "compile.scope": "regional", "compile.rest": "eager", "compile.mode": "max-autotune-no-cudagraphs",
        "compile.fullgraph": True, "amp.dtype": "bfloat16", "ac.policy": "block"}),
    "ddp": make_winner({
        "compile.scope": "module", "compile.optimizer": True, "compile.compiled_autograd": True,
        "ddp.optimize": "python_reducer", "optim.impl": "foreach"}, world_size=2,
        effects=[COMPILED_OPTIMIZER, COMPILED_AUTOGRAD]),
    "fsdp2": make_winner({
        "compile.scope": "regional", "ac.policy": "block", "parallel.strategy": "fsdp2",
        "fsdp.order": "shard_then_compile", "fsdp.reshard_after_forward": False, "fsdp.mp_policy": "bf16"},
        world_size=2),
}


@pytest.fixture
def clean_env() -> Iterator[None]:
    """TrainingArguments and the Accelerate plugins read and write os.environ and a process-wide state."""
    pytest.importorskip("accelerate")  # the dev extra's; the GPU machines hold torch only
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def gap_knobs(gaps: list[Any]) -> set[str]:
    return {g.knob for g in gaps}


# --- Accelerate ---------------------------------------------------------------------------------------------

def accelerate_launch_env(path: Path) -> tuple[Any, dict[str, str]]:
    """What ``accelerate launch --config_file PATH train.py`` loads and hands the training processes."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    loaded = load_config_from_file(str(path))  # raises on any key ClusterConfig does not have
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args = _validate_launch_command(args)[0]  # (args, defaults, mixed precision from the file)
    env = prepare_multi_gpu_env(args) if args.use_fsdp or args.multi_gpu else prepare_simple_launcher_cmd_env(args)[1]
    return loaded, env


@pytest.mark.parametrize("name", list(WINNERS))
def test_accelerate_config_loads_and_launches_the_winner(name: str, tmp_path: Path, clean_env: None) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin, TorchDynamoPlugin

    w = WINNERS[name]
    path = tmp_path / "best_config.accelerate.yaml"
    path.write_text(accelerate_yaml(w))
    loaded, env = accelerate_launch_env(path)
    assert loaded.num_processes == w.world_size
    assert loaded.distributed_type.value == {"eager": "NO", "regional_ac_bf16": "NO", "ddp": "MULTI_CPU",
                                             "fsdp2": "FSDP"}[name]
    assert env["ACCELERATE_MIXED_PRECISION"] == ("bf16" if name in ("regional_ac_bf16", "fsdp2") else "no")
    os.environ.update(env)  # what each training process sees; the plugins read their settings from it
    dynamo = TorchDynamoPlugin()
    if name == "eager":
        assert dynamo.backend.value == "NO"
    else:
        assert dynamo.backend.value == "INDUCTOR" and dynamo.mode == w.knob("compile.mode")
        assert dynamo.fullgraph == w.knob("compile.fullgraph")
        assert dynamo.use_regional_compilation == (w.scope == "regional")
    if name == "fsdp2":
        fsdp = FullyShardedDataParallelPlugin()
        assert fsdp.fsdp_version == 2 and fsdp.reshard_after_forward is False and fsdp.activation_checkpointing


def test_accelerate_names_what_it_cannot_express_with_the_measured_cost() -> None:
    assert accelerate_gaps(WINNERS["eager"]) == []
    assert "Everything the winner sets is expressed" in accelerate_yaml(WINNERS["eager"])
    assert gap_knobs(accelerate_gaps(WINNERS["regional_ac_bf16"])) == {"compile.rest", "ac.policy"}
    ddp = {g.knob: g for g in accelerate_gaps(WINNERS["ddp"])}
    assert set(ddp) == {"compile.optimizer", "compile.compiled_autograd", "ddp.wrap_order", "ddp.optimize",
                        "optim.impl"}
    assert ddp["compile.optimizer"].step_change == pytest.approx(0.041)
    assert "+4.1% [95% CI +2.0, +6.0]" in ddp["compile.optimizer"].cost
    # Measured the other way round (False -> True was 1/6 faster): without it, steps are 20% slower.
    assert ddp["compile.compiled_autograd"].step_change == pytest.approx(0.2)
    assert ddp["ddp.optimize"].cost == "not measured"
    text = accelerate_yaml(WINNERS["ddp"])
    assert "# - compile.optimizer: True -> False." in text and "optimize_ddp = 'python_reducer'" in text
    fsdp = gap_knobs(accelerate_gaps(WINNERS["fsdp2"]))
    assert fsdp == {"fsdp.order", "amp.dtype", "fsdp.mp_policy"}  # its bf16 also autocasts and reduces in bf16


# --- HF Trainer ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(WINNERS))
def test_trainer_arguments_are_accepted_by_training_arguments(name: str, tmp_path: Path, clean_env: None) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin, TorchDynamoPlugin
    from transformers import TrainingArguments

    w = WINNERS[name]
    doc = json.loads(trainer_json(w))
    os.environ.update(doc["environment"])
    kwargs = doc["training_arguments"] | {"output_dir": str(tmp_path)}
    args = TrainingArguments(**kwargs)
    assert args.per_device_train_batch_size == 4 and args.learning_rate == 0.001 and args.max_grad_norm == 1.0
    assert args.torch_compile == w.compiled
    assert args.bf16 == (name in ("regional_ac_bf16", "fsdp2"))
    assert args.gradient_checkpointing == (name == "regional_ac_bf16")  # FSDP checkpoints through fsdp_config
    if w.compiled:  # as Trainer.create_accelerator_and_postprocess builds it
        dynamo = TorchDynamoPlugin(backend=args.torch_compile_backend, mode=args.torch_compile_mode, dynamic=None)
        assert dynamo.mode == w.knob("compile.mode") and dynamo.fullgraph == w.knob("compile.fullgraph")
        assert dynamo.use_regional_compilation == (w.scope == "regional")
    if name == "fsdp2":
        assert args.fsdp
        fsdp = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
        assert fsdp.fsdp_version == 2 and fsdp.reshard_after_forward is False and fsdp.activation_checkpointing
    gaps = {g["knob"] for g in doc["not_expressible"]}
    assert gaps == {"eager": set(), "regional_ac_bf16": {"compile.rest"},
                    "ddp": {"compile.optimizer", "compile.compiled_autograd", "ddp.wrap_order", "ddp.optimize",
                            "optim.impl"},
                    "fsdp2": {"fsdp.order", "amp.dtype", "fsdp.mp_policy"}}[name]


# --- torchtitan ---------------------------------------------------------------------------------------------

# The sections best_config.torchtitan.toml writes, each key with its type, from torchtitan's
# torchtitan/config/job_config.py at commit 238fa9953e4aec2a62582121564273d7cbb1e9f1 (pytorch/torchtitan, Feb 2026,
# the last commit that reads TOML; PR #2386 moved configs to Python).
TORCHTITAN_KEYS: dict[str, dict[str, Any]] = {
    "training": {
        "dataset": str, "dataset_path": str, "local_batch_size": int, "global_batch_size": int, "seq_len": int,
        "max_norm": float | int, "steps": int, "enable_cpu_offload": bool, "dtype": Literal["bfloat16", "float32"],
        "mixed_precision_param": Literal["bfloat16", "float32"], "mixed_precision_reduce": Literal["float32"],
        "gc_freq": int, "gc_debug": bool},
    "parallelism": {
        "data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
        "fsdp_reshard_after_forward": Literal["default", "always", "never"], "tensor_parallel_degree": int,
        "disable_loss_parallel": bool, "enable_async_tensor_parallel": bool, "pipeline_parallel_degree": int,
        "context_parallel_degree": int, "expert_parallel_degree": int, "expert_tensor_parallel_degree": int},
    "activation_checkpoint": {
        "mode": Literal["selective", "full", "memory_budget", "none"], "selective_ac_option": str,
        "early_stop": bool, "memory_budget": float, "preserve_rng_state": bool, "determinism_check": str,
        "debug": bool},
    "compile": {"enable": bool, "components": list, "backend": str},
    "optimizer": {
        "name": str, "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float,
        "implementation": Literal["for-loop", "foreach", "fused"], "early_step_in_backward": bool},
}


def check_torchtitan_value(section: str, key: str, value: Any) -> None:
    kind = TORCHTITAN_KEYS[section][key]
    if getattr(kind, "__origin__", None) is Literal:
        assert value in get_args(kind), (section, key, value)
    else:
        assert isinstance(value, kind) and not (kind is int and isinstance(value, bool)), (section, key, value)


@pytest.mark.parametrize("name", list(WINNERS))
def test_torchtitan_toml_parses_with_documented_keys(name: str) -> None:
    w = WINNERS[name]
    parsed = tomllib.loads(torchtitan_toml(w))
    assert set(parsed) <= set(TORCHTITAN_KEYS)
    for section, values in parsed.items():
        for key, value in values.items():
            assert key in TORCHTITAN_KEYS[section], f"[{section}] {key} is not a torchtitan key"
            check_torchtitan_value(section, key, value)
    assert parsed["compile"]["enable"] == w.compiled
    assert parsed["activation_checkpoint"]["mode"] == ("full" if w.knob("ac.policy") == "block" else "none")
    assert parsed["optimizer"] == {"name": "AdamW", "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                   "weight_decay": 0.01, "implementation": "foreach" if name == "ddp" else "for-loop"}
    assert parsed["training"]["max_norm"] == 1.0 and parsed["training"]["local_batch_size"] == 4
    degrees = parsed["parallelism"]
    assert (degrees["data_parallel_replicate_degree"], degrees["data_parallel_shard_degree"]) == {
        "eager": (1, 1), "regional_ac_bf16": (1, 1), "ddp": (2, 1), "fsdp2": (1, 2)}[name]
    if name == "fsdp2":  # bf16 parameters through fully_shard's MixedPrecisionPolicy, fp32 reductions
        assert degrees["fsdp_reshard_after_forward"] == "never"
        assert parsed["training"]["mixed_precision_param"] == "bfloat16"
    if name == "eager":
        assert parsed["training"]["mixed_precision_param"] == "float32"  # torchtitan's default is bfloat16


def test_torchtitan_names_what_it_cannot_express() -> None:
    assert torchtitan_gaps(WINNERS["eager"]) == []
    assert gap_knobs(torchtitan_gaps(WINNERS["regional_ac_bf16"])) == {"compile.mode", "placement.order"}
    ddp = {g.knob: g for g in torchtitan_gaps(WINNERS["ddp"])}
    assert set(ddp) == {"compile.scope", "compile.fullgraph", "compile.optimizer", "compile.compiled_autograd",
                        "placement.order", "ddp.optimize"}  # torchtitan compiles blocks, always with fullgraph=True
    assert ddp["compile.optimizer"].step_change == pytest.approx(0.041)
    fsdp2 = WINNERS["fsdp2"]  # .to() order is no knob under FSDP2 once its knobs exist: fully_shard places
    assert gap_knobs(torchtitan_gaps(fsdp2)) == {"fsdp.order", "compile.rest", "compile.fullgraph"} | (
        {"placement.order"} if fsdp2.active("placement.order") else set())
    assert "# - fsdp.order: 'shard_then_compile' -> 'compile_then_shard'." in torchtitan_toml(WINNERS["fsdp2"])


# --- shared -------------------------------------------------------------------------------------------------

def test_cost_comes_from_the_verdict_between_exactly_those_values() -> None:
    identical = Effect("placement.order", "", "to_then_compile", "compile_then_to", 0.0, 0.0, 0.0, 2, True, True)
    failed = Effect("compile.fullgraph", "", False, True, 0, 0, 0, 0, True, basis="verdict", failure="graph break")
    effects = [identical, failed, COMPILED_OPTIMIZER]
    assert measured_cost(effects, "placement.order", "compile_then_to", "to_then_compile")[0].startswith("none:")
    assert "failed in the study (graph break)" in measured_cost(effects, "compile.fullgraph", False, True)[0]
    assert measured_cost(effects, "compile.mode", "lite", "default") == ("not measured", None)
    assert measured_cost(effects, "compile.optimizer", True, "something else") == ("not measured", None)


def test_run_dir_gets_the_three_files(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"workload": {**WORKLOAD, "nproc_per_node": 2, "nnodes": 1}}))
    w = WINNERS["ddp"]
    chosen = Entry(number=7, name="", config=dict(w.config), baseline=None, time_to_train_s=1.0, trial_dir=None,
                   result=Measurement.from_dict({"status": "ok", "environment": {"device": "cpu", "world_size": 2}}))
    report = SimpleNamespace(study_name="s", effects=[COMPILED_OPTIMIZER], recommended=chosen)
    got = winner_of(report, tmp_path)
    assert got is not None and (got.world_size, got.device, got.workload["batch_size"]) == (2, "cpu", 4)
    write_framework_configs(report, tmp_path)
    names = {"best_config.accelerate.yaml", "best_config.trainer.json", "best_config.torchtitan.toml"}
    assert names <= {p.name for p in tmp_path.iterdir()}
    assert yaml.safe_load((tmp_path / "best_config.accelerate.yaml").read_text())["distributed_type"] == "MULTI_CPU"
    write_framework_configs(SimpleNamespace(study_name="s", effects=[], recommended=None), tmp_path / "none")


def assert_study_exports_load(run_dir: Path, compiled: bool, batch_size: int, world_size: int = 1) -> None:
    """The three exports a real study wrote next to its best_config.py, each read by its framework's own reader
    (Accelerate's config loader and launcher, ``TrainingArguments(**json)``, ``tomllib`` against torchtitan's
    documented keys), naming the study's winner: compiled or not, its batch size, its processes. Called by the
    studies of tests/test_tuner.py, so that a report that stops writing them fails a study test."""
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    names = ("best_config.accelerate.yaml", "best_config.trainer.json", "best_config.torchtitan.toml")
    missing = [n for n in names if not (run_dir / n).is_file()]
    assert not missing, f"the study wrote no {missing} in {run_dir}"
    saved = dict(os.environ)
    try:
        loaded, env = accelerate_launch_env(run_dir / "best_config.accelerate.yaml")
        assert loaded.num_processes == world_size
        assert env.get("ACCELERATE_DYNAMO_BACKEND", "NO") == ("INDUCTOR" if compiled else "NO"), env
        doc = json.loads((run_dir / "best_config.trainer.json").read_text())
        os.environ.update(doc["environment"])
        args = TrainingArguments(**doc["training_arguments"] | {"output_dir": str(run_dir / "trainer")})
        assert args.torch_compile == compiled and args.per_device_train_batch_size == batch_size
    finally:
        os.environ.clear()
        os.environ.update(saved)
        AcceleratorState._reset_state(reset_partial_state=True)
    parsed = tomllib.loads((run_dir / "best_config.torchtitan.toml").read_text())
    for section, values in parsed.items():
        assert set(values) <= set(TORCHTITAN_KEYS[section]), section
    assert parsed["compile"]["enable"] == compiled and parsed["training"]["local_batch_size"] == batch_size


def test_a_compile_memory_budget_winner_is_memory_budget_ac_in_torchtitan_and_a_gap_elsewhere() -> None:
    """Issue 37: ``ac.policy=budget_0.5`` is torchtitan main's ``MemoryBudgetAC`` (its config function and the
    ``activation-checkpoint:memory-budget`` subcommand); torchtitan 0.2.2's TOML, Accelerate and the Trainer have
    no key for it, and each says the line of code that sets it."""
    from autocompile.report.export.titan_python import command_line, torchtitan_python

    w = make_winner({"compile.scope": "module", "compile.backend": "inductor", "ac.policy": "budget_0.5"})
    assert "config.activation_checkpoint = MemoryBudgetAC.Config(memory_budget=0.5)" in torchtitan_python(w)
    assert command_line(w, "mymodule", "my_config").endswith("activation-checkpoint:memory-budget")
    for gaps in (torchtitan_gaps(w), accelerate_gaps(w)):
        (gap,) = [g for g in gaps if g.knob == "ac.policy"]
        assert "activation_memory_budget = 0.5" in gap.how
