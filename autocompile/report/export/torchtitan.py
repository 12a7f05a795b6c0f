"""``best_config.torchtitan.toml``: the winner as torchtitan's compile, activation-checkpoint, parallelism,
training and optimizer sections, with what torchtitan cannot express as comments.

Keys and their meaning from torchtitan's ``torchtitan/config/job_config.py`` and
``torchtitan/models/llama3/infra/parallelize.py`` at commit 238fa9953e4aec2a62582121564273d7cbb1e9f1, the
last one that reads TOML (``--job.config_file``); ``torchtitan/config/`` is the same there as at the tag v0.2.2
(73a0e69, the last release, on PyPI), whose ``ConfigManager`` loads this file (``scripts/torchtitan_exports.sh``).
There torchtitan applies AC per TransformerBlock, then
``torch.compile(block, backend=..., fullgraph=True)`` per block (no mode, no dynamic), then ``fully_shard``
per block and on the root (mixed precision through ``MixedPrecisionPolicy``, no autocast) or
``replicate`` (DDP, autocast with ``training.mixed_precision_param``, ``optimize_ddp="ddp_optimizer"`` when
compiled). Since PR #2386 (Feb 2026) a torchtitan run is a Python function returning ``Trainer.Config``:
``titan_python`` writes that export.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from autocompile.report.export.gaps import Gap, Winner, optimizer_hyper

TORCHTITAN_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"
TORCHTITAN_RELEASE = "0.2.2"
"""The last torchtitan release, and the last that reads TOML (tag v0.2.2, commit 73a0e69)."""
OPTIMIZERS = {"torch.optim.AdamW": "AdamW", "torch.optim.Adam": "Adam"}
"""torchtitan's ``build_optimizers``: the optimizer names it builds, by the study's optimizer target."""
IMPLEMENTATIONS = {"for_loop": "for-loop", "foreach": "foreach", "fused": "fused"}


class TrainingBase(TypedDict):
    local_batch_size: int
    seq_len: int
    """The longest of the study's sequence lengths."""
    mixed_precision_param: str
    mixed_precision_reduce: str


class Training(TrainingBase, total=False):
    """``[training]``."""

    max_norm: float
    """Where the study clipped gradients."""
    global_batch_size: int
    """Where the study accumulated gradients."""


class DataParallel(TypedDict):
    data_parallel_replicate_degree: int
    data_parallel_shard_degree: int


class Parallelism(DataParallel, total=False):
    """``[parallelism]`` (the TOML and the Python config alike)."""

    fsdp_reshard_after_forward: str
    """``always`` or ``never``: FSDP2 winners only."""


class Checkpointing(TypedDict):
    """``[activation_checkpoint]``."""

    mode: str


class CompileEnable(TypedDict):
    enable: bool


class CompileSection(CompileEnable, total=False):
    """``[compile]``: ``components`` and ``backend`` when the winner compiles."""

    components: list[str]
    backend: str


class OptimizerSection(TypedDict, total=False):
    """``[optimizer]``: ``implementation`` always; the rest for an optimizer torchtitan builds (Adam, AdamW)."""

    name: str
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    implementation: str


class SectionsBase(TypedDict):
    training: Training
    parallelism: Parallelism
    activation_checkpoint: Checkpointing
    compile: CompileSection


class Sections(SectionsBase, total=False):
    """The TOML's sections, in the file's order."""

    optimizer: OptimizerSection


def torchtitan_gaps(w: Winner) -> list[Gap]:
    """What torchtitan's (TOML) config cannot say of the winner."""
    gaps = compile_gaps(w) + training_gaps(w)
    if str(w.knob("ac.policy")).startswith("budget_"):
        gaps.append(w.gap("ac.policy", "none", "torchtitan 0.2.2's activation_checkpoint.mode has no memory budget: "
                          f"set torch._functorch.config.activation_memory_budget = {budget(w)} before the first "
                          "compile (torchtitan main: MemoryBudgetAC in best_config_torchtitan.py)."))
    return gaps


def budget(w: Winner) -> float | None:
    """The winner's compile activation memory budget (``ac.policy=budget_*``), or None."""
    from autocompile.config.choices import MEMORY_BUDGETS

    return MEMORY_BUDGETS.get(w.knob("ac.policy"))


def compile_gaps(w: Winner) -> list[Gap]:
    """Where and how torchtitan compiles: each block, default mode, fullgraph, no options."""
    gaps = []
    if w.scope in ("module", "train_step"):
        gaps.append(w.gap("compile.scope", "regional", "torchtitan compiles each TransformerBlock (apply_compile); "
                          "it has no whole-model or train-step compile."))
    if w.scope == "regional" and w.knob("compile.granularity") != "block":
        gaps.append(w.gap("compile.granularity", "block", "apply_compile compiles whole TransformerBlocks."))
    if w.active("compile.rest") and w.knob("compile.rest") == "compiled":
        gaps.append(w.gap("compile.rest", "eager", "torchtitan compiles the blocks (and the loss with \"loss\" in "
                          "compile.components), not the embeddings, final norm or head."))
    if w.compiled:
        if w.knob("compile.mode") != "default":
            gaps.append(w.gap("compile.mode", "default", "apply_compile passes no mode."))
        if w.active("compile.fullgraph") and not w.knob("compile.fullgraph"):
            gaps.append(w.gap("compile.fullgraph", True, "apply_compile always compiles with fullgraph=True."))
        if w.active("compile.dynamic") and w.knob("compile.dynamic") is not None:
            gaps.append(w.gap("compile.dynamic", None, "apply_compile passes no dynamic (automatic)."))
    for key, value in w.config.items():
        if key.startswith("compile.options.") and value is not None:
            gaps.append(w.gap(key, None, "torchtitan passes no inductor options."))
    return gaps


def training_gaps(w: Winner) -> list[Gap]:
    """The rest of torchtitan's train step: eager optimizer and clipping, meta-device init, its AMP and DDP."""
    gaps = []
    if w.active("compile.optimizer") and w.knob("compile.optimizer"):
        gaps.append(w.gap("compile.optimizer", False, "torchtitan steps its optimizers eagerly."))
    if w.active("compile.compiled_autograd") and w.knob("compile.compiled_autograd"):
        gaps.append(w.gap("compile.compiled_autograd", False, "torchtitan has no compiled-autograd setting."))
    if w.active("optim.clip") and w.knob("optim.clip") == "compiled":
        gaps.append(w.gap("optim.clip", "eager", "torchtitan clips in eager code (dist_utils.clip_grad_norm_)."))
    if w.active("placement.order") and w.knob("placement.order") == "to_then_compile":
        gaps.append(w.gap("placement.order", "compile_then_to", "torchtitan builds the model on the meta device, "
                          "compiles and shards it, then materialises it on the device (to_empty)."))
    if w.active("amp.placement") and w.knob("amp.placement") == "inside":
        gaps.append(w.gap("amp.placement", "outside", "torchtitan's autocast (maybe_enable_amp) wraps forward and "
                          "loss in the train step, outside the compiled blocks."))
    if w.strategy == "fsdp2" and w.knob("amp.dtype") != "none":
        gaps.append(w.gap("amp.dtype", "none", "under FSDP torchtitan casts through fully_shard's "
                          "MixedPrecisionPolicy and adds no autocast (maybe_enable_amp)."))
    if w.strategy != "fsdp2" and w.knob("amp.dtype") == "float16":
        gaps.append(w.gap("amp.dtype", "bfloat16", "training.mixed_precision_param takes bfloat16 or float32."))
    if w.strategy == "ddp" and w.active("ddp.optimize") and w.knob("ddp.optimize") != "ddp_optimizer":
        gaps.append(w.gap("ddp.optimize", "ddp_optimizer", "apply_ddp sets optimize_ddp=\"ddp_optimizer\" when "
                          "the model is compiled."))
    if w.active("fsdp.order") and w.knob("fsdp.order") == "shard_then_compile":
        gaps.append(w.gap("fsdp.order", "compile_then_shard", "parallelize applies AC, compile, then fully_shard."))
    return gaps


def torchtitan_sections(w: Winner) -> Sections:
    """The TOML sections, each key one of ``job_config.py``'s at :data:`TORCHTITAN_COMMIT`."""
    work = w.workload
    shard = w.strategy == "fsdp2"
    if shard:
        param = "bfloat16" if w.knob("fsdp.mp_policy", "none") == "bf16" else "float32"
    else:
        param = "float32" if w.knob("amp.dtype") == "none" else "bfloat16"
    seq_len = work.get("seq_len") or [2048]
    training: Training = {"local_batch_size": int(work.get("batch_size", 8)), "seq_len": int(max(seq_len)),
                          "mixed_precision_param": param, "mixed_precision_reduce": "float32"}
    if float(work.get("grad_clip_norm", 0.0)) > 0:
        training["max_norm"] = float(work["grad_clip_norm"])
    accum = int(work.get("grad_accum_steps", 1))
    if accum > 1:  # torchtitan accumulates gradients up to the global batch
        training["global_batch_size"] = training["local_batch_size"] * w.world_size * accum
    sections: Sections = {"training": training, "parallelism": parallelism(w),
                          "activation_checkpoint": {"mode": "full" if w.knob("ac.policy") == "block" else "none"},
                          "compile": {"enable": w.compiled}}
    if w.compiled:
        sections["compile"]["components"] = ["model"]
        sections["compile"]["backend"] = str(w.knob("compile.backend"))
    optimizer = optimizer_section(w)
    if optimizer:
        sections["optimizer"] = optimizer
    return sections


def parallelism(w: Winner) -> Parallelism:
    """``[parallelism]``: DDP replicates, FSDP2 shards (and reshards after forward, or not)."""
    shard = w.strategy == "fsdp2"
    section: Parallelism = {"data_parallel_replicate_degree": w.world_size if w.strategy == "ddp" else 1,
                            "data_parallel_shard_degree": w.world_size if shard else 1}
    if shard:
        section["fsdp_reshard_after_forward"] = "always" if w.knob("fsdp.reshard_after_forward", True) else "never"
    return section


def optimizer_section(w: Winner) -> OptimizerSection:
    """``[optimizer]``: the study's optimizer and ``optim.impl`` (the device's default where it is ``default``)."""
    target, hyper = optimizer_hyper(w.workload)
    impl = w.knob("optim.impl")
    implementation = IMPLEMENTATIONS.get(impl) or ("foreach" if w.device == "cuda" else "for-loop")
    if target not in OPTIMIZERS:
        return {"implementation": implementation}
    section: OptimizerSection = {"name": OPTIMIZERS[target]}
    if "lr" in hyper:
        section["lr"] = float(hyper["lr"])
    if "betas" in hyper:
        section["beta1"], section["beta2"] = (float(b) for b in hyper["betas"])
    if "eps" in hyper:
        section["eps"] = float(hyper["eps"])
    if "weight_decay" in hyper:
        section["weight_decay"] = float(hyper["weight_decay"])
    section["implementation"] = implementation
    return section


def torchtitan_toml(w: Winner) -> str:
    """``best_config.torchtitan.toml``: header, the gaps as comments, then the sections."""
    lines = [*w.header("torchtitan"),
             f"# Read by torchtitan {TORCHTITAN_RELEASE} and older releases (and main up to commit "
             f"{TORCHTITAN_COMMIT[:7]}, Feb 2026):",
             "# --job.config_file best_config.torchtitan.toml; keys of torchtitan/config/job_config.py there. Newer",
             "# torchtitan (PR #2386 on) reads Python config functions instead: best_config_torchtitan.py beside this."]
    target = str((w.workload.get("optimizer") or {}).get("_target_") or "")
    if target and target not in OPTIMIZERS:
        lines.append(f"# The study's optimizer {target} is not one torchtitan builds (Adam, AdamW).")
    if float(w.workload.get("grad_clip_norm", 0.0)) <= 0:
        lines.append("# The study did not clip gradients; torchtitan always clips at training.max_norm (default 1.0).")
    if len(set(w.workload.get("seq_len") or [])) > 1:
        lines.append("# The study varied the sequence length; torchtitan trains at one training.seq_len (the longest).")
    precision = str(w.workload.get("float32_matmul_precision", "highest"))  # before the field: torch's default
    if w.device == "cuda":
        lines.append(f"# float32 matmuls ran under torch.set_float32_matmul_precision({precision!r}); none of the "
                     "sections below sets it: call it in your train script.")
    if w.strategy == "ddp":
        lines.append("# torchtitan's DDP (replicate) uses bucket_cap_mb=100; the study's DDP, torch's default (25).")
    gaps = torchtitan_gaps(w)
    if gaps:
        lines.append("# not_expressible (the winner's value -> what torchtitan does; the cost from the study's "
                     "verdicts):")
        for g in gaps:
            lines += g.comment()
    else:
        lines.append("# Everything the winner sets is expressed below.")
    for name, section in torchtitan_sections(w).items():
        lines += ["", f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in section.items())]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A TOML literal for the values written here: bools, numbers, strings and lists of strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)  # a JSON string or list of strings is a valid TOML basic string / array
