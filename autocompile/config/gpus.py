"""The GPUs and their compiler as the tuner sees them, read without a CUDA context in the tuner's process.

A context costs memory on its GPU (slot 0's trials lose it for the whole study) and an EXCLUSIVE_PROCESS
GPU refuses every other process while it lives. So the tuner asks nvidia-smi (NVML, what torch itself
asks before CUDA is initialised: ``torch.cuda.device_count``), and where nvidia-smi cannot answer, a
short child process that exits with its context. Measured on an H100 with torch 2.11 (GPU memory in use
while a fresh process lives): ``device_count`` 0 MiB, ``is_available`` 4 MiB (the driver, no context),
``get_device_name`` / ``get_device_properties`` 4 MiB but torch's CUDA state initialised (``_lazy_init``:
no fork after it), ``mem_get_info`` 527 MiB (``cudaMemGetInfo`` makes the current device's context), a
CUDA tensor likewise. None of them here; the trial workers, which own their GPU, use them freely.

GPU ids are as the trials get them in ``CUDA_VISIBLE_DEVICES``: indices, ``GPU-`` UUIDs or ``MIG-`` ids.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 30.0
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton")
"""Names torch's CUDA wheels pin their Triton under (releases; nightlies)."""


def visible_gpus() -> list[str]:
    """The GPUs this process may hand to trials, as ``CUDA_VISIBLE_DEVICES`` entries."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # Kept as given: indices, GPU-… UUIDs and MIG-… ids all pass through to the trials.
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    # Before CUDA is initialised device_count asks NVML, else cudaGetDeviceCount (the driver starts, no
    # context is made): torch/cuda/__init__.py device_count.
    return [str(i) for i in range(torch.cuda.device_count())]


def _smi(gpu: str, field: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of ``gpu``; None when nvidia-smi cannot say (absent, a MIG id)."""
    exe = shutil.which("nvidia-smi")
    if exe is None or gpu.startswith("MIG-"):
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", gpu],
                             capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


def _child(gpu: str, expression: str) -> str | None:
    """``expression`` (over ``torch``) printed by a child process that sees only ``gpu``: its CUDA
    context ends with it. None without CUDA in this torch build (nothing to ask)."""
    import torch

    if not torch.backends.cuda.is_built():
        return None
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    try:
        out = subprocess.run([sys.executable, "-c", f"import torch; print({expression})"], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not read %s of GPU %s in a child process: %s", expression, gpu, exc)
        return None
    return out.splitlines()[-1] if out else None


def gpu_name(gpu: str | None = None) -> str:
    """The model name of ``gpu`` (default: the first visible one), as ``torch.cuda.get_device_name`` says it."""
    gpus = visible_gpus()
    gpu = gpu if gpu is not None else (gpus[0] if gpus else "0")
    return _smi(gpu, "name") or _child(gpu, "torch.cuda.get_device_name(0)") or "unknown CUDA GPU"


def free_memory(gpu: str | None = None) -> float | None:
    """Free bytes on ``gpu`` (default: the first visible one, where a trial without a slot runs); None when
    nothing could read it."""
    gpus = visible_gpus()
    gpu = gpu if gpu is not None else (gpus[0] if gpus else "0")
    mib = _smi(gpu, "memory.free")
    if mib is not None:
        with contextlib.suppress(ValueError):
            return float(mib) * 2**20
    found = _child(gpu, "torch.cuda.mem_get_info(0)[0]")
    with contextlib.suppress(TypeError, ValueError):
        return float(found)  # type: ignore[arg-type]
    return None


def native_bf16(gpu: str | None = None) -> bool:
    """Whether ``gpu`` (default: the first visible one) runs bfloat16 matrix math natively: compute capability
    8.0 or newer (A100, H100, H200, L4, RTX 30xx and later). False when nothing could read it."""
    gpus = visible_gpus()
    gpu = gpu if gpu is not None else (gpus[0] if gpus else "0")
    found = _smi(gpu, "compute_cap") or _child(gpu, "'.'.join(map(str, torch.cuda.get_device_capability(0)))")
    try:
        return float(found or 0) >= 8.0
    except ValueError:
        return False


def triton_pin(requirements: list[str]) -> tuple[str, str] | None:
    """(distribution, version) of the Triton that torch's metadata pins (``triton==3.6.0; platform_system ==
    "Linux"``), or None: a build that pins none (CPU wheels, source builds) or whose pin's marker excludes
    this machine."""
    for line in requirements:
        found = re.match(r"\s*(triton|pytorch-triton)\s*==\s*([^\s;,]+)\s*(?:;(.*))?$", line)
        if not found:
            continue
        name, version, marker = found.groups()
        if marker and "extra" not in marker:
            try:
                from packaging.markers import Marker
            except ImportError:  # cannot evaluate it: take the pin as applying
                return name, version
            if not Marker(marker).evaluate():
                continue
        elif marker:
            continue  # an optional extra's pin
        return name, version
    return None


def triton_problem(pin: tuple[str, str] | None, installed: dict[str, str], import_error: str | None,
                   torch_version: str) -> str | None:
    """Why inductor cannot use the installed Triton (one line naming the fix), or None.

    ``pin``: :func:`triton_pin` of torch's requirements; ``installed``: distribution -> version of the
    Triton distributions present; ``import_error``: why ``import triton`` failed (None: it imported)."""
    fix = f"pip install '{pin[0]}=={pin[1]}'" if pin else "install the Triton your torch build was made with"
    if pin is not None:
        have = installed.get(pin[0])
        if have is None and installed:
            other, version = next(iter(installed.items()))
            return (f"torch {torch_version} needs {pin[0]}=={pin[1]} but {other} {version} is installed: "
                    f"pip uninstall -y {other} && {fix}")
        if have is not None and have != pin[1]:
            return (f"torch {torch_version} needs {pin[0]}=={pin[1]} but {have} is installed (an unpinned "
                    f"`pip install triton` replaces it): {fix}")
        if have is None:
            return f"torch {torch_version} needs {pin[0]}=={pin[1]}, which is not installed: {fix}"
    if import_error is not None:
        return f"triton does not import ({import_error}): inductor cannot compile for the GPU; {fix}"
    return None


def check_triton() -> str | None:
    """:func:`triton_problem` for this environment (a study on CUDA compiles with inductor's Triton kernels)."""
    import torch

    pin = triton_pin(importlib.metadata.requires("torch") or [])
    installed = {}
    for name in TRITON_DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            installed[name] = importlib.metadata.version(name)
    import_error = None
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 (a broken install fails in many ways; any of them is the answer)
        import_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return triton_problem(pin, installed, import_error, torch.__version__)


def device_name(device: str) -> str:
    """The accelerator's or the CPU's model name: studies on a shared storage never mix machines."""
    if device == "cuda":
        return gpu_name()  # not torch.cuda.get_device_name: the tuner makes no CUDA context
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
