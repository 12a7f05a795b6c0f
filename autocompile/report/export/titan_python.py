"""``best_config_torchtitan.py``: the winner as a torchtitan config function, for torchtitan's Python configs.

Since PR #2386 (2026-02-23, commit 9810191) a torchtitan run is a function returning ``Trainer.Config``, named
on the command line (``--module M --config F``) and loaded by ``torchtitan/config/manager.py``'s
``ConfigManager``, which then lets ``--section.option`` flags override it (tyro). Fields written here, from
torchtitan at :data:`TITAN_PYTHON_COMMIT` (main, 2026-08-21; no release reads this format yet):

- ``Trainer.Config.compile``: ``CompileConfig(enable, components, backend)`` (``torchtitan/config/configs.py``);
  ``apply_compile`` (``torchtitan/distributed/compile.py``) compiles each TransformerBlock with
  ``fullgraph=True``, no mode, no dynamic, no options.
- ``Trainer.Config.activation_checkpoint``: ``FullAC.Config()``, ``SelectiveAC.Config()`` (the default),
  ``MemoryBudgetAC.Config(memory_budget=...)`` or ``None`` (``torchtitan/distributed/activation_checkpoint.py``;
  on the command line ``activation-checkpoint:full`` / ``:none``).
- ``Trainer.Config.parallelism``: ``data_parallel_replicate_degree``, ``data_parallel_shard_degree``,
  ``fsdp_reshard_after_forward``. ``parallelize_llama`` applies AC, compile, then ``apply_fsdp_to_decoder``
  always (a replicate degree is a mesh dimension of ``fully_shard``: there is no DDP wrapper any more, and
  no autocast: mixed precision is ``fully_shard``'s ``MixedPrecisionPolicy`` at ``training.mixed_precision_param``).
- ``Trainer.Config.training``: ``num_tokens_per_microbatch_per_dp_rank`` (batch x sequence),
  ``max_context_length``, ``num_tokens_per_train_step`` (accumulation), ``mixed_precision_param`` (default
  bfloat16), ``max_norm``.
- ``Trainer.Config.optimizer``: ``default_adamw(lr, **kwargs)`` (``torchtitan/components/optimizer/optimizer.py``:
  one catch-all ``ParamGroupConfig``; its own defaults are betas (0.9, 0.95) and weight decay 0.1, so the
  study's values, torch's defaults included, are written out) and ``implementation``.
"""

from __future__ import annotations

from typing import TypedDict

from autocompile.report.export.gaps import Gap, Winner, optimizer_hyper
from autocompile.report.export.torchtitan import (
    IMPLEMENTATIONS,
    Parallelism,
    budget,
    compile_gaps,
    parallelism,
    training_gaps,
)

TITAN_PYTHON_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
"""pytorch/torchtitan main on 2026-08-21, whose config code this export was written against and loaded by."""
FIRST_PYTHON_COMMIT = "9810191bb"
"""PR #2386, the first commit whose torchtitan reads Python config functions (and no TOML)."""
BASE_CONFIG = ("torchtitan.models.llama3.config_registry", "llama3_debugmodel", "llama3")
"""The config function the export starts from (its module, its name, its ``--module`` shorthand): the model,
data and tokenizer are your run's, so put yours here."""
TORCH_ADAMW = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
"""``torch.optim.AdamW``'s defaults: written where the study kept them, since torchtitan's differ."""


class TrainingBase(TypedDict):
    num_tokens_per_microbatch_per_dp_rank: int
    max_context_length: int
    mixed_precision_param: str
    max_norm: float


class Training(TrainingBase, total=False):
    """``Trainer.Config.training``'s fields set."""

    num_tokens_per_train_step: int
    """Where the study accumulated gradients."""


class Fields(TypedDict):
    """The ``Trainer.Config`` sections set field by field (``config.<section>.<field> = ...``), in order."""

    training: Training
    parallelism: Parallelism


def python_gaps(w: Winner) -> list[Gap]:
    """What torchtitan's Python config cannot say of the winner: the TOML releases' gaps, but mixed precision
    and DDP as this torchtitan has them (``fully_shard`` always, no autocast, no DDP)."""
    gaps = [g for g in compile_gaps(w) + training_gaps(w) if g.knob not in ("amp.dtype", "amp.placement",
                                                                            "ddp.optimize")]
    if w.knob("amp.dtype") not in (None, "none") and w.strategy != "fsdp2":
        gaps.append(w.gap("amp.dtype", "none", "this torchtitan adds no autocast: training.mixed_precision_param="
                          "bfloat16 casts the parameters through fully_shard's MixedPrecisionPolicy instead (set)."))
    if w.strategy == "ddp":
        for key in ("ddp.wrap_order", "ddp.optimize"):
            if w.active(key):
                gaps.append(w.gap(key, "fully_shard", "this torchtitan has no DDP: data_parallel_replicate_degree "
                                  "replicates through fully_shard on a replicate mesh dimension."))
    return gaps


def python_fields(w: Winner) -> Fields:
    """Each ``Trainer.Config`` section's fields to set, as Python literals' values."""
    work = w.workload
    seq = int(max(work.get("seq_len") or [2048]))
    batch = int(work.get("batch_size", 8))
    shard = w.strategy == "fsdp2"
    bf16 = (w.knob("fsdp.mp_policy", "none") == "bf16") if shard else w.knob("amp.dtype") not in (None, "none")
    training: Training = {"num_tokens_per_microbatch_per_dp_rank": batch * seq, "max_context_length": seq,
                          "mixed_precision_param": "bfloat16" if bf16 else "float32",
                          "max_norm": float(work.get("grad_clip_norm", 0.0) or 0.0) or 1.0}
    accum = int(work.get("grad_accum_steps", 1))
    if accum > 1:
        training["num_tokens_per_train_step"] = batch * seq * w.world_size * accum
    return {"training": training, "parallelism": parallelism(w)}


def optimizer_line(w: Winner) -> str | None:
    """``config.optimizer = default_adamw(...)`` for the study's AdamW, None for another optimizer."""
    target, hyper = optimizer_hyper(w.workload)
    if target != "torch.optim.AdamW":
        return None
    kwargs = {**TORCH_ADAMW, **{k: v for k, v in hyper.items() if k in ("betas", "eps", "weight_decay")}}
    kwargs["betas"] = tuple(float(b) for b in kwargs["betas"])
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"config.optimizer = default_adamw(lr={float(hyper.get('lr', 1e-3))!r}, {shown})"


def command_line(w: Winner, module: str, function: str) -> str:
    """The torchtitan command line that runs a config function with the winner's settings as overrides."""
    fields = python_fields(w)
    parts = [f"--module {module} --config {function}",
             "--compile.enable" if w.compiled else "--compile.no-enable"]
    if w.compiled:
        parts.append(f"--compile.components model --compile.backend {w.knob('compile.backend')}")
    for section, values in fields.items():
        parts += [f"--{section}.{key} {value}" for key, value in values.items()]
    parts.append(f"--optimizer.implementation {implementation(w)}")
    # A tyro subcommand: the options after it would be its own, so it comes last.
    parts.append({"block": "activation-checkpoint:full"}.get(str(w.knob("ac.policy")), "activation-checkpoint:none")
                 if budget(w) is None else "activation-checkpoint:memory-budget")
    return " ".join(parts)


def implementation(w: Winner) -> str:
    return IMPLEMENTATIONS.get(w.knob("optim.impl")) or ("foreach" if w.device == "cuda" else "for-loop")


def torchtitan_python(w: Winner) -> str:
    """``best_config_torchtitan.py``: a module torchtitan's ``--module`` imports, with ``autocompile_best()``."""
    base_module, base_fn, shorthand = BASE_CONFIG
    ranks = w.world_size
    lines = ['"""torchtitan config function for autocompile\'s winner (torchtitan main from PR #2386 on).', "",
             *(line.lstrip("# ") for line in w.header("torchtitan")),
             f"Written against torchtitan/config/ at commit {TITAN_PYTHON_COMMIT[:9]} (main, 2026-08-21), which",
             "loads it with its own ConfigManager; torchtitan reads Python config functions since commit",
             f"{FIRST_PYTHON_COMMIT} (PR #2386, Feb 2026) and no release reads them yet: torchtitan 0.2.2 and",
             "older read best_config.torchtitan.toml beside this file.", "",
             "Run it, this folder on PYTHONPATH:",
             f"    torchrun --nproc_per_node={ranks} -m torchtitan.train --module best_config_torchtitan "
             "--config autocompile_best",
             "Or keep your own config function and override it on the command line (flags win over the function):",
             f"    torchrun --nproc_per_node={ranks} -m torchtitan.train "
             f"{command_line(w, shorthand, base_fn)}"]
    gaps = python_gaps(w)
    if gaps:
        lines += ["", "not_expressible (the winner's value -> what torchtitan does; the cost from the study's "
                  "verdicts):"]
        for g in gaps:
            lines += [c[2:] for c in g.comment()]
    else:
        lines += ["", "Everything the winner sets is expressed below."]
    if float(w.workload.get("grad_clip_norm", 0.0) or 0.0) <= 0:
        lines.append("The study did not clip gradients; torchtitan always clips (max_norm 1.0 is written).")
    lines += ['"""', "", "from torchtitan.components.optimizer import default_adamw",
              "from torchtitan.config import CompileConfig",
              "from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC",
              "# the config function to start from: yours, with your model, data and tokenizer",
              f"from {base_module} import {base_fn} as base",
              "from torchtitan.trainer import Trainer", "", "",
              "def autocompile_best() -> Trainer.Config:", "    config = base()"]
    backend = f", components=[\"model\"], backend={str(w.knob('compile.backend'))!r}" if w.compiled else ""
    lines.append(f"    config.compile = CompileConfig(enable={w.compiled}{backend})")
    checkpoint = ("FullAC.Config()" if w.knob("ac.policy") == "block" else "None  # no activation checkpointing"
                  if budget(w) is None else f"MemoryBudgetAC.Config(memory_budget={budget(w)})")
    lines.append(f"    config.activation_checkpoint = {checkpoint}")
    for section, values in python_fields(w).items():
        lines += [f"    config.{section}.{key} = {value!r}" for key, value in values.items()]
    optimizer = optimizer_line(w)
    if optimizer:
        lines.append(f"    {optimizer}")
    else:
        target = optimizer_hyper(w.workload)[0]
        lines.append(f"    # the study's optimizer {target} is not written: torchtitan names its own (ParamGroupConfig)"
                     [:120])
    lines += [f"    config.optimizer.implementation = {implementation(w)!r}", "    return config"]
    return "\n".join(lines) + "\n"
