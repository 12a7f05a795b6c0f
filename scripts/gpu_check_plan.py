"""The GPU check's plan: its stages, what each one checks, their time budgets and the device commands that run
them. Plain data and the standard library only (no torch, no autocompile), so ``gpu_check.py --dry-run`` runs
anywhere.

The device machine allows 10 minutes per command and about 30 per session, so the check is three commands of at
most 9 minutes each, 25 minutes together with their installs (``COMMANDS``); every budget is an estimate for
GPT-2 124M on one H100 with 16 cores until a run on the box replaces it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_S = 20.0
"""Per command: the wrapper's install of the carried wheels and the package, and reading the environment."""
COMMAND_LIMIT_S = 540.0
"""One device command: 9 minutes, a minute under the device's 10 so that an overrun still reports."""
TOTAL_LIMIT_S = 1500.0
"""All commands together, installs included (issue 27: 25 minutes of GPU time)."""
TEST_WORKERS = 4
"""pytest-xdist processes sharing the GPU in the tests stage (the compiles use the box's 16 cores)."""
KILL_GRACE_S = 15.0
"""Ending a stage past its time takes this long at most (SIGINT, a wait, SIGKILL); kept inside its budget."""
CUDA_TESTS = "tests/test_cuda.py"
BF16 = {"amp.dtype": "bfloat16"}
FP32 = {"amp.dtype": "none"}


@dataclass(frozen=True)
class Check:
    """One thing the tests stage proves, and the tests in ``tests/test_cuda.py`` that prove it."""

    what: str
    budget_s: float
    """Serial seconds of its tests (estimate); the stage runs them on ``TEST_WORKERS`` processes."""
    tests: str
    """Regular expression (case-insensitive) over the test functions' names that prove it."""
    finding: int = 0
    """Issue 27's finding it covers (0: a GPU path tested before); a test whose docstring says
    "finding N" counts for finding N too."""


@dataclass(frozen=True)
class BenchConfig:
    """One row of the GPT-2 124M table: one trial in a fresh torchrun process tree."""

    name: str
    knobs: dict[str, Any]
    cap_s: float
    """Most seconds this trial may take (its measure.timeout_s), start and compile included."""
    expect_s: float
    """Expected seconds (estimate, cold compile on 16 cores); a stage's budget covers the sum."""
    cuda_only: bool = False
    warm_from: str = ""
    """Reuse the inductor cache of that earlier configuration of the same stage (its compile is then warm)."""
    note: str = ""
    workload: dict[str, Any] = field(default_factory=dict)
    """Workload fields other than batch size, lengths and device (e.g. ``float32_matmul_precision``)."""


@dataclass(frozen=True)
class Stage:
    name: str
    budget_s: float
    """Its share of the command's time, the time it takes to stop it included."""
    what: str
    checks: tuple[Check, ...] = ()
    configs: tuple[BenchConfig, ...] = ()


def tf32(name: str, scope: str, precision: str, expect_s: float) -> BenchConfig:
    return BenchConfig(name, {"compile.scope": scope, **FP32}, 150, expect_s, cuda_only=True,
                       note=f"fp32, torch.set_float32_matmul_precision({precision!r})",
                       workload={"float32_matmul_precision": precision})


STAGES = (
    Stage("tests", 300, f"pytest -m cuda {CUDA_TESTS}: the GPU-only paths on tiny models", checks=(
        Check("CUDA-graph modes (reduce-overhead, max-autotune) in module/regional/train_step scope: losses equal "
              "eager fp32 and graphs really recorded", 240, r"cuda_graph_modes_in_every_scope"),
        Check("activation checkpointing under CUDA graphs (module, regional): losses equal eager", 40,
              r"activation_checkpointing_under_cuda_graphs"),
        Check("fp16 through a GradScaler under module compile: scaled, updated, losses equal eager fp16", 30,
              r"fp16_steps_through_a_grad_scaler"),
        Check("the worker on a GPU: allocator peak memory, MFU against the GPU's peak", 60,
              r"allocator_peak_memory|hopper"),
        Check("CUDA graphs with grad_accum_steps=2: refused or correct gradients", 40, r"accum", finding=1),
        Check("a model-output loss under module scope with CUDA graphs: losses read after later replays equal "
              "eager", 30, r"model_loss|output_loss|model_output", finding=3),
        Check("CUDA-graph re-recordings counted, kept out of the timed windows", 40, r"re_?record", finding=4),
        Check("fp16 + train_step + a CUDA-graph mode: the GradScaler's update outside the graph, no "
              "cudagraphs_skipped", 40, r"fp16.*(train_step|cuda_?graph)|(train_step|cuda_?graph).*fp16", finding=7),
        Check("batches staged on the device before the timed loop: no host copy inside a window", 30,
              r"stag|prefetch|pinned", finding=9),
        Check("event-based window timing: CUDA events per window, one synchronize at the end", 30, r"event",
              finding=10),
    )),
    Stage("table", 480, "GPT-2 124M, bf16, batch 8 x 1024, one cold trial per configuration", configs=(
        BenchConfig("eager", {"compile.scope": "none", **BF16}, 90, 25),
        BenchConfig("default", {"compile.scope": "module", **BF16}, 150, 65, note="torch.compile(model)"),
        BenchConfig("reduce-overhead", {"compile.scope": "module", "compile.mode": "reduce-overhead", **BF16}, 150,
                    75, cuda_only=True),
        BenchConfig("regional", {"compile.scope": "regional", **BF16}, 150, 55, note="each GPT2Block"),
        BenchConfig("train_step", {"compile.scope": "train_step", **BF16}, 180, 90,
                    note="forward, loss, backward, optimizer"),
        BenchConfig("fp16+scaler", {"compile.scope": "module", "amp.dtype": "float16"}, 150, 65, cuda_only=True,
                    note="float16 autocast with a GradScaler"),
        BenchConfig("ac+cudagraphs", {"compile.scope": "module", "compile.mode": "reduce-overhead",
                                      "ac.policy": "block", **BF16}, 150, 75, cuda_only=True,
                    note="per-block checkpointing under CUDA graphs"),
    )),
    Stage("tf32", 220, "GPT-2 124M in fp32, TF32 off/on pairs (issue 27 finding 15)", configs=(
        tf32("eager-fp32", "none", "highest", 30),
        tf32("eager-fp32-tf32", "none", "high", 25),
        tf32("default-fp32", "module", "highest", 75),
        tf32("default-fp32-tf32", "module", "high", 70),
    )),
    Stage("autotune", 290, "GPT-2 124M under max-autotune, bf16", configs=(
        # Cold max-autotune benchmarks Triton kernel choices for every matmul shape; max-autotune then reuses
        # that cache (same shapes, same choices), so it measures what CUDA graphs add.
        BenchConfig("max-autotune-no-cudagraphs",
                    {"compile.scope": "module", "compile.mode": "max-autotune-no-cudagraphs", **BF16}, 200, 170),
        BenchConfig("max-autotune", {"compile.scope": "module", "compile.mode": "max-autotune", **BF16}, 100, 70,
                    cuda_only=True, warm_from="max-autotune-no-cudagraphs",
                    note="autotuning cache reused from max-autotune-no-cudagraphs"),
    )),
    Stage("study", 110, "a 4-trial study of gpt2-tiny end to end (Hydra, Optuna, trials, report; MLflow off)"),
)
STAGE = {s.name: s for s in STAGES}
CONFIGS = tuple(c for s in STAGES for c in s.configs)
COMMANDS = (("tests", "tf32"), ("table",), ("autotune", "study"))
"""The device commands, in order; each runs its stages one after another (never side by side: concurrent
compiles would distort the compile times measured)."""


def command_budget(stages: tuple[str, ...]) -> float:
    return INSTALL_S + sum(STAGE[s].budget_s for s in stages)


def device_command(stages: tuple[str, ...]) -> str:
    return f"bash scripts/gpu_check.sh --stage {','.join(stages)}"


def cuda_tests(path: Path) -> dict[str, str]:
    """The test functions of ``path`` and their docstrings, read with ``ast`` (nothing imported)."""
    if not path.exists():
        return {}
    tree = ast.parse(path.read_text(), str(path))
    return {node.name: ast.get_docstring(node) or "" for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def tests_of(check: Check, tests: dict[str, str]) -> list[str]:
    """The test functions that prove ``check``."""
    tag = re.compile(rf"finding {check.finding}\b", re.I) if check.finding else None
    return [name for name, doc in tests.items()
            if re.search(check.tests, name, re.I) or (tag is not None and tag.search(doc))]


def dry_run(root: Path) -> str:
    """Every command, stage, check and configuration with its budget; the sums checked against the limits."""
    tests = cuda_tests(root / CUDA_TESTS)
    lines = [f"GPU check: {len(COMMANDS)} device commands (limits: {COMMAND_LIMIT_S:.0f} s each, "
             f"{TOTAL_LIMIT_S:.0f} s together, installs included); each command carries .whl (scripts/"
             "prepare_wheels.sh) and writes its files to $OUT."]
    for i, stages in enumerate(COMMANDS, 1):
        lines += ["", f"command {i}: {device_command(stages)}   [budget {command_budget(stages):.0f} s, "
                      f"carry .whl, timeout_s {COMMAND_LIMIT_S + 30:.0f}]",
                  f"  install   {INSTALL_S:4.0f} s  carried wheels + the package; environment: GPU, driver, "
                  "triton against torch's pin (issue 27 finding 8)"]
        for name in stages:
            s = STAGE[name]
            lines.append(f"  stage {s.name:<9}{s.budget_s:4.0f} s  {s.what}")
            for c in s.checks:
                found = tests_of(c, tests)
                label = f"issue 27 finding {c.finding}" if c.finding else "GPU path"
                lines.append(f"    check {c.budget_s:4.0f} s  {c.what} ({label}) <- "
                             + (", ".join(found) if found else f"NO TEST in {CUDA_TESTS} yet"))
            for b in s.configs:
                extra = {**b.knobs, **{f"workload.{k}": v for k, v in b.workload.items()}}
                knobs = " ".join(f"{k}={v}" for k, v in extra.items())
                lines.append(f"    config {b.expect_s:3.0f} s  {b.name}: {knobs} (cap {b.cap_s:.0f} s"
                             + (f", warm from {b.warm_from}" if b.warm_from else "") + ")")
            if s.checks:
                lines.append(f"    (check budgets are serial seconds: {sum(c.budget_s for c in s.checks):.0f} s "
                             f"on {TEST_WORKERS} pytest workers)")
    total = sum(command_budget(c) for c in COMMANDS)
    lines += ["", f"total {total:.0f} s = {total / 60:.1f} min of {TOTAL_LIMIT_S / 60:.0f}; then, here: "
                  "python scripts/gpu_check.py --merge benchmarks/results/<device> (the files of all commands)"]
    return "\n".join(lines)


def check_plan() -> list[str]:
    """What is wrong with the plan's budgets (empty when nothing)."""
    problems = []
    listed = [s for c in COMMANDS for s in c]
    if sorted(listed) != sorted(STAGE):
        problems.append(f"every stage must run in exactly one command: {listed}")
    for c in COMMANDS:
        if command_budget(c) > COMMAND_LIMIT_S:
            problems.append(f"{device_command(c)}: {command_budget(c):.0f} s > {COMMAND_LIMIT_S:.0f} s")
    if sum(command_budget(c) for c in COMMANDS) > TOTAL_LIMIT_S:
        problems.append(f"commands take more than {TOTAL_LIMIT_S:.0f} s together")
    for s in STAGES:
        need = sum(b.expect_s for b in s.configs) + sum(c.budget_s for c in s.checks) / TEST_WORKERS + KILL_GRACE_S
        if need > s.budget_s:
            problems.append(f"stage {s.name}: expected {need:.0f} s > budget {s.budget_s:.0f} s")
        if any(b.expect_s > b.cap_s for b in s.configs):
            problems.append(f"stage {s.name}: a configuration expects more than its cap")
    return problems
