"""What a timing process reads about itself for its result: the kind of a failure, the environment it ran
in, its peak memory and its MFU. Torch only, like the workers that use it."""

from __future__ import annotations

import logging
import os
import platform
import re
import resource
from pathlib import Path
from typing import Any

import torch

from autocompile.config.torch_private import LOGGERS, compile_times, counters, dynamo_exc, guard_failures
from autocompile.trial.program.build import NonFiniteLoss
from autocompile.trial.program.graphs import NothingCompiled, PartiallyCompiled
from autocompile.trial.timing.result import Environment, Failure, TrialResult


class CompileInTimedPart(RuntimeError):
    """Dynamo kept compiling in the timed windows: no steady state to time."""


class NotSameProgram(RuntimeError):
    """Beside the others, a candidate compiled another program than in its own process."""


def same_program(fingerprint: str, expected: str | None) -> None:
    """A candidate beside others compiled the program of its own cold process (``expected``; None: unchecked)."""
    if expected and fingerprint != expected:
        raise NotSameProgram(f"compiled program {fingerprint} beside the other candidates, {expected} in its own "
                             "process: it cannot share a process with them")


class CudaGraphsSkipped(RuntimeError):
    """A CUDA-graph mode whose graphs inductor declined: it ran as another program."""


class RanksDiverged(RuntimeError):
    """Data-parallel ranks ended the burst with different parameters: the gradients were not synchronised."""


# Dense bf16 tensor-core peaks (FLOP/s) for MFU, by the words of the device name (first match
# wins: "NVIDIA H100 PCIe" before "H100"); anything else: measure.peak_tflops.
# NVL parts run at a lower clock than SXM (H100 NVL 835 TFLOP/s dense); GH200's Hopper is the SXM part.
PEAK_FLOPS = (
    (("H100", "PCIE"), 756e12), (("H100", "NVL"), 835e12), (("H100",), 989e12),
    (("H200", "NVL"), 835e12), (("H200",), 989e12), (("GH200",), 989e12), (("H20",), 148e12),
    (("A100",), 312e12), (("L40S",), 362e12), (("L4",), 121e12), (("A10",), 125e12),
)

# Device out-of-memory that reaches Python as another exception type than torch.OutOfMemoryError: cuBLAS
# or cuDNN failing to allocate a workspace, a raw CUDA runtime error, and NCCL's buffers. A Triton kernel
# "out of resource: shared memory" is a compile-time limit of one kernel choice, not memory: not here.
OOM_WORDS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed", "cudaerrormemoryallocation")


def is_oom(exc: BaseException, reason: str) -> bool:
    """An out-of-memory of the device (or of the host, for a CPU trial), whatever the type it came as."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = reason.lower()
    return any(word in text for word in OOM_WORDS)


ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal's colour and bold codes."""


def classify(exc: BaseException) -> Failure:
    """Kind and a readable reason: the first lines of the message, not the traceback."""
    dynamo = dynamo_exc()

    text = ANSI.sub("", str(exc))  # torch's own messages bold a warning: a terminal's codes, not words
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    reason = f"{type(exc).__name__}: " + " | ".join(lines[:4])[:800]
    name = type(exc).__name__
    if is_oom(exc, reason):
        kind = "oom"
    elif isinstance(exc, NonFiniteLoss):
        kind = "nan_loss"
    elif isinstance(exc, NothingCompiled):
        kind = "nothing_compiled"
    elif isinstance(exc, PartiallyCompiled):
        kind = "partially_compiled"
    elif isinstance(exc, CompileInTimedPart):
        kind = "compile_in_timed_part"
    elif isinstance(exc, CudaGraphsSkipped) or ("cudagraph" in reason.lower() and "skip" in reason.lower()):
        kind = "cudagraphs_skipped"
    elif "found no compiled frames" in reason:
        kind = "fullgraph_no_frames"  # torch >= 2.13; 2.11 ran such a step eager without a word
    elif "exceeded maximum reuse entries" in reason:
        kind = "region_reuse_limit"  # torch >= 2.13 nested compile regions
    elif isinstance(exc, NotSameProgram):  # side by side: another program than in its own process
        kind = "not_same_program"
    elif isinstance(exc, RanksDiverged):
        kind = "ranks_diverged"
    elif name == "RanksOutOfStep":  # side by side: a candidate failed on some ranks inside a step
        kind = "ranks_out_of_step"
    elif name in ("FailOnRecompileLimitHit", "RecompileLimitExceeded"):
        kind = "recompile_limit"
    elif isinstance(exc, dynamo.Unsupported):
        kind = "graph_break"
    else:
        kind = "exception"
    return {"failure": kind, "reason": reason}


def short_reason(text: str) -> str:
    """A graph-break reason's headline and explanation, without hints and debug context."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[:2])[:300]


def guard_failure_counts() -> dict[str, int]:
    """How many guard failures dynamo has recorded per compiled function so far (a snapshot to diff against)."""
    return {_code_name(code): len(reasons) for code, reasons in list(guard_failures().items())}


def recompile_reasons(before: dict[str, int], most: int = 5) -> list[str]:
    """The guards that failed since ``before`` (:func:`guard_failure_counts`), as ``TORCH_LOGS=recompiles``
    names them: ``forward (model.py:41): 0/0: tensor 'x' size mismatch at index 1. expected 16, actual 32``."""
    found = [f"{name}: {reason}" for code, reasons in list(guard_failures().items())
             for name in [_code_name(code)] for reason in reasons[before.get(name, 0):]]
    return [short_reason(r) for r in found[:most]]


def _code_name(code: Any) -> str:
    return f"{code.co_name} ({Path(code.co_filename).name}:{code.co_firstlineno})"


class RecompileLimitHits(logging.Handler):
    """Dynamo's "hit config.recompile_limit" warnings, kept: where the limit is not a hard failure, the frame's
    calls past it run eager (what the user's job gets under plain torch), and the result says so."""

    PREFIX = "torch._dynamo hit config."

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(self.PREFIX):  # "<limit> (<n>) / function: ... / last reason: ..." on one line
            hit = " ".join(line.strip() for line in text.splitlines()[:3])[len("torch._dynamo "):]
            if hit not in self.hits:  # dynamo says it again at each call past the limit
                self.hits.append(hit)

    def install(self) -> RecompileLimitHits:
        logging.getLogger(LOGGERS["convert_frame"]).addHandler(self)
        return self


def check_cuda_graphs(device: torch.device) -> None:
    """A CUDA-graph mode whose graphs inductor declined ran as another program: its ``cudagraph_skips`` counter
    fails the run (not ``triton.cudagraph_or_error``: inductor's FX-graph cache key holds every config, and the
    winner's artifacts would miss in the user's own process)."""
    skips = counters()["inductor"]["cudagraph_skips"]
    if device.type == "cuda" and skips:
        raise CudaGraphsSkipped(f"inductor skipped CUDA graphs {skips} time(s): the mode ran as another program (see "
                                "the process's stderr for the reason)")


def tree_cpu_s() -> float:
    """CPU seconds of this process and everything under it: its threads, reaped children (the C++ compiler's
    processes) and live ones (inductor's compile workers), read from ``/proc`` through psutil."""
    import psutil

    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended between the listing and the read: reaped, counted above once waited for
            continue
        total += times.user + times.system
    return total


def loss_values(losses: list[torch.Tensor]) -> list[float] | None:
    """The steps' losses as numbers (one copy from the device); None when there are none."""
    return [float(x) for x in torch.stack(losses).float().cpu().tolist()] if losses else None


def dynamo_compile_times() -> dict[str, float]:
    """Dynamo's own seconds per compile phase (``torch._dynamo.utils.compile_times``)."""
    return compile_times()


def reset_peak_memory(device: torch.device) -> str:
    """Start the steady-state reading of peak memory here (after the warm-up); returns where the reading
    comes from. CUDA: the allocator's peak, reset now, so compile-time buffers (autotuning benchmarks,
    inductor's workspace) are left out; the CUDA-graph pools recorded in the warm-up stay allocated and
    count, as they would in the user's job. CPU: the process's maximum resident set, which cannot be reset:
    it still includes the warm-up."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda max_memory_allocated after the warm-up"
    return "ru_maxrss since the process started (cannot be reset)"


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def mfu(flops_per_token: float | None, tokens_per_s: float, device: torch.device, world_size: int,
        peak_tflops: float) -> float | None:
    peak = peak_tflops * 1e12
    if not peak and device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(device))
    if not peak or not flops_per_token:
        return None
    return flops_per_token * tokens_per_s / (peak * world_size)


def peak_flops(device_name: str) -> float:
    """"NVIDIA A100-SXM4-80GB" -> words A100, SXM4, 80GB -> the A100 peak; 0.0 when unknown."""
    words = set(re.split(r"[\s\-_]+", device_name.upper()))
    return next((flops for needed, flops in PEAK_FLOPS if words.issuperset(needed)), 0.0)


def environment(device: torch.device | None, rank: int, threads: int | None = None) -> Environment:
    name = platform.processor() or platform.machine()
    if device is not None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device.type if device is not None else None,
        "device_name": name,
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "hostname": platform.node(),
        "rank": rank,
        "cpus": sorted(os.sched_getaffinity(0)),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def set_graphs(result: TrialResult) -> None:
    """What dynamo compiled in this process: its distinct graphs and its graph breaks, with their reasons."""
    counted = counters()
    result.graph_count = counted["stats"]["unique_graphs"]
    result.graph_breaks = sum(counted["graph_break"].values())
    result.graph_break_reasons = {short_reason(k): v for k, v in counted["graph_break"].items()}
