"""``best_config.py``: the code that applies a study's winner, with the study's parts and its
compile artifacts (a warm start), runnable as is on the study's synthetic data."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace
from autocompile.config.spec import PARTS
from autocompile.report.export.script_snippet import script_snippet
from autocompile.report.findings.entry import Entry
from autocompile.trial.timing.compile_artifacts import ARTIFACTS

SNIPPET = '''"""Apply the best configuration autocompile found for {model} (study {study}, trial {number}).

Measured: {tokens:,.0f} {rate}, {step_ms:.2f} ms/step, compile {compile_s:.1f} s.
Measure it again:  {command}
"""

import os
from pathlib import Path

import torch

from autocompile import Env, TrialConfig, apply
from autocompile.workload.parts import build_loss, optimizer_factory, schedule_factory

KNOBS = {knobs}
DEVICE = {device!r}
SEED = {seed!r}  # the study's workload.seed: every trial started from these weights and data
WORKLOAD = {workload}
# The float32 matmul precision every GPU trial ran with ("high": TF32 tensor cores): part of what was measured.
FLOAT32_MATMUL_PRECISION = {matmul_precision!r}
# The CPU threads every trial ran with: inductor's CPU cache key holds them, so the artifacts hit only at this count.
THREADS = {threads!r}
# The winner's compile artifacts, kept by the study (torch.compiler.save_cache_artifacts).
ARTIFACTS = Path(globals().get("__file__", "best_config.py")).with_name({artifacts!r})
{local_device}

def warm_start() -> None:
    """Load the winner's compile artifacts when they are next to this file: its compile is then mostly
    cache hits (same torch, device and model code; anything else just compiles)."""
    if ARTIFACTS.is_file():
        if THREADS and not str(DEVICE).startswith("cuda") and torch.get_num_threads() != THREADS:
            print(f"best_config: the compile artifacts were made with {{THREADS}} CPU threads, this process has "
                  f"{{torch.get_num_threads()}}: every graph will compile cold (set OMP_NUM_THREADS={{THREADS}})")
        torch.compiler.load_cache_artifacts(ARTIFACTS.read_bytes())


def build_step(model: torch.nn.Module, optimizer=None, loss_fn=None, lr_schedule=None):
    """Your model compiled the way that measured best (call after init_process_group for DDP or FSDP2). The
    optimizer, loss and schedule default to the study's (an optimizer or a factory taking the parameters)."""
    warm_start()
    if str(DEVICE).startswith("cuda"):  # as the study's trials did (GPU only)
        torch.set_float32_matmul_precision(FLOAT32_MATMUL_PRECISION)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    config = TrialConfig.from_flat(KNOBS, Env.detect(DEVICE, world_size, shapes_vary={shapes_vary}))
    return apply(model, optimizer or optimizer_factory(WORKLOAD["optimizer"]), loss_fn or build_loss(WORKLOAD["loss"]),
                 config, device={step_device},
                 lr_schedule=lr_schedule if lr_schedule is not None else schedule_factory(WORKLOAD["lr_schedule"]),
                 grad_clip_norm=WORKLOAD["grad_clip_norm"], grad_accum_steps=WORKLOAD["grad_accum_steps"])


if __name__ == "__main__":
    # The tuned workload on its synthetic data; replace the model, parts and data with yours.{launch_hint}
    from autocompile.workload.infer import model_facts
    from autocompile.workload.models import build
    from autocompile.workload.parts import build_data
{setup}
    if THREADS and not str(DEVICE).startswith("cuda"):
        torch.set_num_threads(THREADS)  # as every trial ran: the warm start hits only at this count
    torch.manual_seed(SEED)
    model = build({target!r}, {kwargs!r})
    step = build_step(model)
    facts = dict(model_facts(model), batch_size={batch_size}, seq_len={seq_len!r}, seed=SEED, world_size=world_size_,
                 rank=int(os.environ.get("RANK", 0)), device={data_device}{vocab})
    data = build_data(WORKLOAD["data"], facts)
    for i in range(10 * WORKLOAD["grad_accum_steps"]):
        loss = step(*data(i))
    print("compiled:", step.compiled, "loss:", float(loss))
{teardown}'''

LOCAL_DEVICE = '''

def local_device() -> str:
    """This process's GPU under torchrun; without set_device every rank lands on cuda:0 (NCCL: "Duplicate GPU")."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    return f"cuda:{local}"
'''

# The device is set first: NCCL binds each rank to the current device when the group starts.
PER_GPU_SETUP = '''
    device = local_device()
    world_size_ = int(os.environ.get("WORLD_SIZE", 1))
    if world_size_ > 1:
        torch.distributed.init_process_group("nccl")'''

SETUP = '''
    world_size_ = int(os.environ.get("WORLD_SIZE", 1))
    if world_size_ > 1:
        torch.distributed.init_process_group("{backend}")'''

TEARDOWN = '''    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
'''


def snippet(settings: Settings, best: Entry, space: SearchSpace, command: str | None = None,
            run_dir: Path | None = None) -> str:
    """``best_config.py``: one process per GPU (LOCAL_RANK) for a multi-GPU winner, plain otherwise; for a script
    study, the script run with the winner (:mod:`autocompile.report.export.script_snippet`)."""
    r, w = best.result, settings.workload
    if command is None:  # the report passes the command it already built (composing it reads every model config)
        from autocompile.config.commands import measure_command

        command = measure_command(settings, best.config, (r.environment or {}).get("threads"))
    if settings.script.given:
        return script_snippet(settings, best, command, run_dir or Path.cwd())
    distributed = w.world_size > 1
    per_gpu = distributed and settings.device == "cuda"
    setup = PER_GPU_SETUP if per_gpu else SETUP.format(backend="gloo") if distributed else "\n    world_size_ = 1"
    launch_hint = (f"\n    # Launch it as the study did: torchrun, {w.nproc_per_node} process(es) per node, "
                   f"{w.nnodes} node(s).") if distributed else ""
    workload = {k: v for k, v in asdict(w).items() if k in (*PARTS, "grad_clip_norm", "grad_accum_steps")}
    vocab = settings.model.vocab_size
    return SNIPPET.format(
        model=settings.model.name, study=settings.study.name, number=best.number, tokens=r.tokens_per_s,
        rate=f"{r.unit}/s", step_ms=r.step_s * 1e3, compile_s=r.compile_s, command=docstring_safe(command),
        knobs=python_dict(best.config), device=settings.device, seed=w.seed, workload=python_dict(workload),
        matmul_precision=w.float32_matmul_precision, threads=(r.environment or {}).get("threads"),
        artifacts=ARTIFACTS, local_device=LOCAL_DEVICE if per_gpu else "",
        step_device="local_device()" if per_gpu else "DEVICE", shapes_vary=w.shapes_vary, launch_hint=launch_hint,
        setup=setup, target=settings.model.target, kwargs=settings.model.kwargs, batch_size=w.batch_size,
        seq_len=list(w.seq_len), data_device="device" if per_gpu else "DEVICE",
        vocab=f", vocab_size={vocab}" if vocab else "", teardown=TEARDOWN if distributed else "")


def python_dict(values: dict[str, Any]) -> str:
    """A dict literal, one key a line (repr, not JSON: a string "null" stays a string)."""
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in values.items()) + "}"


def docstring_safe(text: str) -> str:
    """``text`` inside a triple-quoted docstring: backslashes doubled, no closing quotes."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
