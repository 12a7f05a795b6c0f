"""The winner in the user's framework: ``best_config.accelerate.yaml`` (an Accelerate config file),
``best_config.trainer.json`` (HF ``TrainingArguments`` keyword arguments), ``best_config.torchtitan.toml`` (torchtitan
0.2.2 and older) and ``best_config_torchtitan.py`` (torchtitan's Python config function, main since PR #2386).

Each file carries what its framework cannot express as comments or a ``not_expressible`` list
(:class:`autocompile.report.export.gaps.Gap`), each with its cost from the study's own verdicts.

Keys checked against the frameworks' sources: accelerate 1.15 (``commands/config/config_args.py``
``ClusterConfig``; ``commands/config/cluster.py`` writes ``dynamo_config.dynamo_*`` and ``fsdp_config.fsdp_*``;
``utils/launch.py`` turns them into the ``ACCELERATE_DYNAMO_*``/``FSDP_*`` variables that
``TorchDynamoPlugin`` and ``FullyShardedDataParallelPlugin`` read), transformers 5.23 (``training_args.py``
``TrainingArguments``; ``trainer.py`` builds ``TorchDynamoPlugin(backend, mode, dynamic=None)``, the rest
of the dynamo settings from the environment). torchtitan: :mod:`autocompile.report.export.torchtitan` (TOML) and
:mod:`autocompile.report.export.titan_python`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Protocol, TypedDict

import yaml

from autocompile.report.export.gaps import Gap, GapDoc, Winner, optimizer_hyper
from autocompile.report.export.titan_python import torchtitan_python
from autocompile.report.export.torchtitan import torchtitan_toml
from autocompile.report.findings.entry import Entry
from autocompile.study.statistics.effect import Effect

log = logging.getLogger(__name__)

ACCELERATE_MIXED_PRECISION = {"none": "no", "bfloat16": "bf16", "float16": "fp16"}
ACCELERATE_MODES = ("default", "reduce-overhead", "max-autotune")
"""accelerate 1.15 ``TORCH_DYNAMO_MODES``: the choices of ``accelerate launch --dynamo_mode``. A config file's
mode reaches ``torch.compile`` unchecked (``ACCELERATE_DYNAMO_MODE``), so torch's other modes work from the file."""


class AccelerateFsdp(TypedDict):
    fsdp_version: int
    fsdp_auto_wrap_policy: str
    fsdp_reshard_after_forward: bool
    fsdp_activation_checkpointing: bool


class AccelerateDynamo(TypedDict):
    dynamo_backend: str
    dynamo_mode: str
    dynamo_use_fullgraph: bool
    dynamo_use_dynamic: bool
    dynamo_use_regional_compilation: bool


class AccelerateBase(TypedDict):
    compute_environment: str
    distributed_type: str
    mixed_precision: str
    use_cpu: bool
    num_processes: int
    num_machines: int
    machine_rank: int
    main_training_function: str
    rdzv_backend: str
    same_network: bool
    debug: bool


class AccelerateConfig(AccelerateBase, total=False):
    """``best_config.accelerate.yaml``: an Accelerate ``ClusterConfig``, its FSDP2 and dynamo keys where they apply."""

    fsdp_config: AccelerateFsdp
    dynamo_config: AccelerateDynamo


class TrainerFsdp(TypedDict):
    version: int
    auto_wrap_policy: str
    reshard_after_forward: bool
    activation_checkpointing: bool


class TrainerBase(TypedDict):
    output_dir: str
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_grad_norm: float
    use_cpu: bool
    bf16: bool
    fp16: bool


class TrainerArguments(TrainerBase, total=False):
    """``TrainingArguments`` keyword arguments; the optional ones where the winner and the workload need them.
    Per-block checkpointing is ``activation_checkpointing`` in transformers 5, ``gradient_checkpointing`` before."""

    tf32: bool
    optim: str
    learning_rate: float
    weight_decay: float
    adam_epsilon: float
    adam_beta1: float
    adam_beta2: float
    torch_compile: bool
    torch_compile_backend: str
    torch_compile_mode: str
    ddp_find_unused_parameters: bool
    fsdp: bool
    fsdp_config: TrainerFsdp
    activation_checkpointing: bool
    activation_checkpointing_kwargs: dict[str, bool]
    gradient_checkpointing: bool
    gradient_checkpointing_kwargs: dict[str, bool]


class TrainerJsonBase(TypedDict):
    comment: str
    training_arguments: TrainerArguments
    environment: dict[str, str]
    not_expressible: list[GapDoc]


class TrainerJson(TrainerJsonBase, total=False):
    """``best_config.trainer.json``; ``optimizer``: how to pass the study's optimizer where it is not AdamW."""

    optimizer: str


class Recommendation(Protocol):
    """What the exporters read of a study's report (``summary.Report``)."""

    study_name: str
    recommended: Entry | None
    effects: list[Effect]


def accelerate_gaps(w: Winner, *, trainer: bool = False) -> list[Gap]:
    """What Accelerate's ``prepare()`` cannot do as the winner did (the Trainer prepares through it too):
    it moves the model to its device, wraps DDP (or applies AC, compile, then ``fully_shard``) and compiles
    last, the model only."""
    gaps: list[Gap] = []
    if w.scope == "train_step":
        gaps.append(w.gap("compile.scope", "module", "Accelerate compiles the model, not a train-step function: "
                          "torch.compile your step function in your own loop."))
    if w.scope == "regional" and w.knob("compile.granularity") != "block":
        gaps.append(w.gap("compile.granularity", "block", "use_regional_compilation compiles each repeated block "
                          "(accelerate.utils.compile_regions), not sublayers or nested regions."))
    if w.active("compile.rest") and w.knob("compile.rest") == "eager":
        gaps.append(w.gap("compile.rest", "compiled", "compile_regions also compiles the rest of the model "
                          "(embeddings, final norm, head)."))
    gaps += compiled_extras(w, "Accelerate")
    if w.active("compile.dynamic") and w.knob("compile.dynamic") is None and not trainer:
        gaps.append(w.gap("compile.dynamic", False, "accelerate launch always sets ACCELERATE_DYNAMO_USE_DYNAMIC, "
                          "so dynamic=None (automatic) becomes False; pass TorchDynamoPlugin(dynamic=None) in code."))
    if w.active("amp.placement"):
        theirs = "inside" if w.scope == "module" else "outside"  # autocast wraps model.forward before compiling
        if w.knob("amp.placement") != theirs:
            gaps.append(w.gap("amp.placement", theirs, "Accelerate wraps model.forward in autocast before it "
                              "compiles: inside a compiled module, outside compiled blocks."))
    if w.active("placement.order") and w.knob("placement.order") == "compile_then_to":
        gaps.append(w.gap("placement.order", "to_then_compile",
                          "prepare() moves the model to its device, then compiles."))
    ddp = w.strategy == "ddp"
    if ddp and w.active("ddp.wrap_order") and w.knob("ddp.wrap_order") == "ddp_of_compiled":
        gaps.append(w.gap("ddp.wrap_order", "compile_of_ddp", "prepare() wraps DDP first and compiles the "
                          "wrapper: torch.compile(DDP(model)); compile the model yourself before prepare() to "
                          "get DDP(compiled model)."))
    if ddp and w.active("ddp.optimize") and w.knob("ddp.optimize") != "ddp_optimizer":
        gaps.append(w.gap("ddp.optimize", "ddp_optimizer", "no config key: Accelerate leaves torch's default; set "
                          f"torch._dynamo.config.optimize_ddp = {optimize_ddp_value(w.knob('ddp.optimize'))} "
                          "before prepare() (with the Trainer: before train())."))
    if w.knob("ac.policy") == "block" and w.strategy != "fsdp2" and not trainer:
        gaps.append(w.gap("ac.policy", "none", "no activation-checkpointing key outside FSDP: call "
                          "model.gradient_checkpointing_enable() (transformers models) or checkpoint each block."))
    if w.strategy == "fsdp2":
        gaps += fsdp_gaps(w)
    impl = w.knob("optim.impl")
    if impl != "default" and not (trainer and impl == "fused" and trainer_optim(w)):
        gaps.append(w.gap("optim.impl", "default", f"the optimizer is yours: pass {impl_kwarg(impl)} when you build "
                          "it." if not trainer else f"TrainingArguments' optim has no {impl} AdamW: pass "
                          f"{impl_kwarg(impl)} through Trainer(optimizer_cls_and_kwargs=...)."))
    return gaps


def compiled_extras(w: Winner, framework: str) -> list[Gap]:
    """The compiled parts beside the model that no framework config here compiles: the optimizer step,
    compiled autograd, clipping in compiled code, and inductor options."""
    gaps = []
    if w.active("compile.optimizer") and w.knob("compile.optimizer"):
        gaps.append(w.gap("compile.optimizer", False, f"{framework} compiles the model only: wrap optimizer.step "
                          "in torch.compile yourself (the compiled-optimizer recipe; a tensor LR with a scheduler)."))
    if w.active("compile.compiled_autograd") and w.knob("compile.compiled_autograd"):
        gaps.append(w.gap("compile.compiled_autograd", False, "run loss.backward() inside "
                          "torch._dynamo.compiled_autograd._enable(torch.compile(...)) in your own loop."))
    if str(w.knob("ac.policy")).startswith("budget_"):
        gaps.append(w.gap("ac.policy", "none", f"{framework} has no key for compile's memory budget: set "
                          "torch._functorch.config.activation_memory_budget = "
                          f"{w.knob('ac.policy').removeprefix('budget_')} before the first compile."))
    if w.active("optim.clip") and w.knob("optim.clip") == "compiled":
        gaps.append(w.gap("optim.clip", "eager", f"{framework} clips gradients in eager code."))
    for key in (k for k in w.config if k.startswith("compile.options.") and w.config[k] is not None):
        gaps.append(w.gap(key, None, f"{framework}'s config has no inductor options: pass "
                          f"options={{{key.rpartition('.')[2]!r}: {w.config[key]!r}}} to torch.compile in code."))
    return gaps


def fsdp_gaps(w: Winner) -> list[Gap]:
    """FSDP2 through Accelerate: AC, compile, then ``fully_shard`` per block and the root; ``mixed_precision``
    sets both autocast and ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``."""
    gaps = []
    if w.active("fsdp.order") and w.knob("fsdp.order") == "shard_then_compile":
        gaps.append(w.gap("fsdp.order", "compile_then_shard", "prepare() applies AC, compiles, then calls "
                          "fully_shard; shard first yourself to compile the sharded model."))
    autocast = w.knob("amp.dtype") != "none"
    policy = w.knob("fsdp.mp_policy", "none") == "bf16"
    if autocast and not policy:
        gaps.append(w.gap("fsdp.mp_policy", "bf16", "mixed_precision under FSDP also shards with "
                          "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)."))
    if policy and not autocast:
        gaps.append(w.gap("amp.dtype", "bfloat16", "mixed_precision under FSDP also wraps forward in autocast."))
    if policy:
        gaps.append(w.gap("fsdp.mp_policy", "bf16 reduced in bf16", "Accelerate's policy reduces gradients in bf16, "
                          "the study's in fp32: pass FullyShardedDataParallelPlugin(mixed_precision_policy="
                          "{'param_dtype': 'bf16', 'reduce_dtype': 'fp32'}) in code."))
    return gaps


def accelerate_config(w: Winner) -> AccelerateConfig:
    """The keys of an Accelerate ``ClusterConfig`` file for the winner."""
    distributed = {"single": "NO", "ddp": "MULTI_GPU" if w.device == "cuda" else "MULTI_CPU", "fsdp2": "FSDP"}
    config: AccelerateConfig = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": distributed[w.strategy],
        "mixed_precision": mixed_precision(w), "use_cpu": w.device != "cuda", "num_processes": w.world_size,
        "num_machines": w.nnodes, "machine_rank": 0, "main_training_function": "main", "rdzv_backend": "static",
        "same_network": True, "debug": False,
    }
    if w.strategy == "fsdp2":
        # TRANSFORMER_BASED_WRAP without class names takes the model's _no_split_modules (transformers models):
        # per-block sharding plus the root, as the study did.
        config["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": bool(w.knob("fsdp.reshard_after_forward", True)),
            "fsdp_activation_checkpointing": w.knob("ac.policy") == "block"}
    if w.compiled:
        config["dynamo_config"] = {
            "dynamo_backend": str(w.knob("compile.backend")).upper(), "dynamo_mode": str(w.knob("compile.mode")),
            "dynamo_use_fullgraph": bool(w.knob("compile.fullgraph")),
            "dynamo_use_dynamic": bool(w.knob("compile.dynamic")),
            "dynamo_use_regional_compilation": w.scope == "regional"}
    return config


def accelerate_yaml(w: Winner) -> str:
    """``best_config.accelerate.yaml``: the config, with what it cannot express as comments."""
    lines = [*w.header("Accelerate"), "# Launch: accelerate launch --config_file best_config.accelerate.yaml train.py"]
    if w.device != "cuda" and w.strategy == "ddp":
        lines.append("# MULTI_CPU: accelerate launch starts several CPU processes through mpirun (mpirun_config).")
    if w.compiled and w.knob("compile.mode") not in ACCELERATE_MODES:
        lines.append(f"# dynamo_mode {w.knob('compile.mode')}: not a choice of --dynamo_mode, but the file passes it "
                     "to torch.compile as is.")
    if w.device == "cuda":
        lines.append(f"# float32 matmuls ran under torch.set_float32_matmul_precision({matmul_precision(w)!r}): no "
                     "Accelerate key; call it in train.py.")
    lines += not_expressible_comments(accelerate_gaps(w))
    return "\n".join(lines) + "\n" + yaml.safe_dump(accelerate_config(w), sort_keys=False)


def trainer_arguments(w: Winner) -> TrainerArguments:
    """``TrainingArguments`` keyword arguments for the winner and the study's workload."""
    work = w.workload
    args: TrainerArguments = {
        "output_dir": "trainer_output", "per_device_train_batch_size": int(work.get("batch_size", 8)),
        "gradient_accumulation_steps": int(work.get("grad_accum_steps", 1)),
        # 0 turns the Trainer's clipping (default 1.0) off, as in a study that did not clip.
        "max_grad_norm": float(work.get("grad_clip_norm", 0.0)), "use_cpu": w.device != "cuda",
        "bf16": w.knob("amp.dtype") == "bfloat16" or w.knob("fsdp.mp_policy", "none") == "bf16",
        "fp16": w.knob("amp.dtype") == "float16",
    }
    if w.device == "cuda":  # set either way: with torch_compile and tf32 unset, the Trainer turns TF32 on itself
        args["tf32"] = matmul_precision(w) != "highest"
    _, hyper = optimizer_hyper(work)
    if trainer_optim(w):
        args["optim"] = "adamw_torch_fused" if w.knob("optim.impl") == "fused" else "adamw_torch"
        names = {"lr": "learning_rate", "weight_decay": "weight_decay", "eps": "adam_epsilon"}
        args |= {names[k]: v for k, v in hyper.items() if k in names}
        if "betas" in hyper:
            args["adam_beta1"], args["adam_beta2"] = (float(b) for b in hyper["betas"])
    if w.compiled:
        args |= {"torch_compile": True, "torch_compile_backend": w.knob("compile.backend"),
                 "torch_compile_mode": w.knob("compile.mode")}
    if w.strategy == "ddp":
        args["ddp_find_unused_parameters"] = False  # the study's DDP; the Trainer would otherwise decide per model
    if w.strategy == "fsdp2":
        args["fsdp"] = True
        args["fsdp_config"] = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                               "reshard_after_forward": bool(w.knob("fsdp.reshard_after_forward", True)),
                               "activation_checkpointing": w.knob("ac.policy") == "block"}
    elif w.knob("ac.policy") == "block":
        key = checkpointing_key()
        args |= {key: True, f"{key}_kwargs": {"use_reentrant": False}}  # the study's torch.utils.checkpoint
    return args


def matmul_precision(w: Winner) -> str:
    """The study's ``workload.float32_matmul_precision``; studies from before the field ran at torch's "highest"."""
    return str(w.workload.get("float32_matmul_precision", "highest"))


def trainer_environment(w: Winner) -> dict[str, str]:
    """The dynamo settings ``TrainingArguments`` has no key for: the Trainer's ``TorchDynamoPlugin`` reads them
    from these variables (``accelerate launch --config_file best_config.accelerate.yaml`` sets them too)."""
    if not w.compiled:
        return {}
    env = {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(w.scope == "regional").lower(),
           "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(bool(w.knob("compile.fullgraph"))).lower()}
    if w.knob("compile.dynamic") is not None:
        env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(w.knob("compile.dynamic")).lower()
    return env


def trainer_json(w: Winner) -> str:
    """``best_config.trainer.json``: ``TrainingArguments(**doc["training_arguments"])`` with ``environment`` set."""
    target, _ = optimizer_hyper(w.workload)
    doc: TrainerJson = {
        "comment": " ".join(line.lstrip("# ") for line in w.header("HF Trainer")) + " Use: "
        "TrainingArguments(**training_arguments) with the environment variables set before the Trainer is built.",
        "training_arguments": trainer_arguments(w), "environment": trainer_environment(w),
        "not_expressible": [g.as_dict() for g in accelerate_gaps(w, trainer=True)],
    }
    if target and target != "torch.optim.AdamW":
        doc["optimizer"] = (f"the study's optimizer is {target}: pass it through Trainer(optimizer_cls_and_kwargs="
                            "...); optim names AdamW only")
    return json.dumps(doc, indent=2, default=str) + "\n"


def trainer_optim(w: Winner) -> bool:
    """Whether the workload's optimizer is one TrainingArguments' ``optim`` names (torch's AdamW)."""
    return optimizer_hyper(w.workload)[0] == "torch.optim.AdamW"


def not_expressible_comments(gaps: list[Gap]) -> list[str]:
    if not gaps:
        return ["# Everything the winner sets is expressed below."]
    lines = ["# not_expressible (the winner's value -> what the framework does; the cost from the study's verdicts):"]
    for g in gaps:
        lines += g.comment()
    return lines


def mixed_precision(w: Winner) -> str:
    if w.strategy == "fsdp2" and w.knob("fsdp.mp_policy", "none") == "bf16":
        return "bf16"
    return ACCELERATE_MIXED_PRECISION[str(w.knob("amp.dtype"))]


def optimize_ddp_value(mode: str) -> str:
    return {"ddp_optimizer": "True", "no_optimization": "False"}.get(mode, repr(mode))


def impl_kwarg(impl: str) -> str:
    return {"foreach": "foreach=True", "fused": "fused=True", "for_loop": "foreach=False"}.get(impl, "nothing")


@functools.cache
def checkpointing_key() -> str:
    """transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name warns)."""
    try:
        from transformers import TrainingArguments
    except ImportError:
        return "gradient_checkpointing"
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def winner_of(report: Recommendation, run_dir: Path) -> Winner | None:
    """The report's recommended configuration with the study's workload (``config.yaml`` of the run)."""
    chosen = report.recommended
    if chosen is None:
        return None
    config_file = run_dir / "config.yaml"
    workload = (yaml.safe_load(config_file.read_text()) or {}).get("workload", {}) if config_file.is_file() else {}
    env = chosen.result.environment or {}
    world = int(env.get("world_size") or workload.get("nproc_per_node", 1) * workload.get("nnodes", 1))
    return Winner(config=chosen.config, effects=report.effects, device=env.get("device") or "cpu",
                  world_size=world, nnodes=int(workload.get("nnodes", 1)), workload=workload,
                  study=report.study_name, trial=chosen.number)


def write_framework_configs(report: Recommendation, run_dir: Path) -> None:
    """Next to best_config.py/.yaml: the winner as Accelerate, HF Trainer and torchtitan configs."""
    w = winner_of(report, run_dir)
    if w is None:
        return
    (run_dir / "best_config.accelerate.yaml").write_text(accelerate_yaml(w))
    (run_dir / "best_config.trainer.json").write_text(trainer_json(w))
    (run_dir / "best_config.torchtitan.toml").write_text(torchtitan_toml(w))  # torchtitan 0.2.2 and older
    (run_dir / "best_config_torchtitan.py").write_text(torchtitan_python(w))  # torchtitan main since PR #2386
