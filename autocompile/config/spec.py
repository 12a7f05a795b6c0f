"""What one trial runs: the workload, the model, how to measure, and the knob values.

These dataclasses are the typed config for both sides: Hydra validates the user's config against
them (they are registered as its schema) and the worker reads them back from ``trial.json``.
Standard library only (with ``config.choices`` and ``autocompile.workload``'s ``TargetNode``, standard library
themselves): the worker runs where nothing but PyTorch is installed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autocompile.config.choices import Knobs
from autocompile.config.window_policy import WindowPolicy
from autocompile.workload import TargetNode

DEVICES = ("auto", "cpu", "cuda")
PARTS = ("data", "loss", "optimizer", "lr_schedule")
"""The workload's parts named by ``_target_`` (``autocompile.workload.parts`` builds them)."""
CACHE_MODES = ("cold", "warm")
MATMUL_PRECISIONS = ("highest", "high", "medium")


@dataclass
class ModelSpec:
    """A model factory: ``target(**kwargs)`` returns the ``nn.Module`` the data's inputs are fed to."""

    name: str = "model"
    """Short name used in run names and directories."""
    target: str = "autocompile.workload.models.gpt2"
    """Dotted path of the factory (the model config's ``_target_``)."""
    vocab_size: int | None = None
    """Token ids of the synthetic data are drawn from ``[0, vocab_size)``; None = read from the model's
    input embedding (``workload.data`` gets it when it takes a ``vocab_size`` argument)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the factory."""

    def __post_init__(self) -> None:
        if "." not in self.target:
            raise ValueError(f"model._target_={self.target!r} must be a dotted path like 'mypkg.models.make'")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError(f"model.vocab_size={self.vocab_size} must be >= 2")


@dataclass
class Workload:
    """The training job being tuned; fixed for a whole study, never searched."""

    batch_size: int = 8
    """Sequences per process per step."""
    seq_len: list[int] = field(default_factory=lambda: [128])
    """Sequence length(s); several are cycled per step so that ``compile.dynamic`` matters."""
    nproc_per_node: int = 1
    """Processes per node (torchrun ``--nproc-per-node``); more than one means DDP."""
    nnodes: int = 1
    """Nodes per trial (torchrun ``--nnodes``)."""
    device: str = "auto"
    """``cuda`` when available under ``auto``, else ``cpu``."""
    threads: int = 0
    """Intra-op threads per process; 0 = the cores this process may run on (its affinity) / nproc_per_node."""
    seed: int = 0
    """Seed of the weights and the synthetic data: every trial sees the same numbers."""
    data: TargetNode = field(default_factory=lambda: TargetNode(_target_="autocompile.workload.data.SyntheticTokens"))
    """Inputs and targets of step i (``autocompile.workload.parts``): a class built once with the keys beside
    ``_target_`` and the job facts it takes by name (batch_size, seq_len, seed, rank, device, vocab_size,
    image_size, num_channels, num_labels), its instance called with the step index; or a function called
    with the step index and the same arguments. Returns ``(inputs, targets)``; inputs a tensor, tuple or dict."""
    loss: TargetNode = field(default_factory=lambda: TargetNode(_target_="autocompile.workload.losses.cross_entropy"))
    """``loss(output, targets)``: a function used as is (further keys bound as keyword arguments), or a
    class built with the keys (``torch.nn.CrossEntropyLoss``)."""
    # lr: a keyword argument of the target, as every key beside _target_ and _partial_ (PEP 728's extra_items
    # would declare them; the worker cannot count on a typing_extensions that has it).
    optimizer: TargetNode = field(default_factory=lambda: TargetNode(  # type: ignore[typeddict-unknown-key]
        _target_="torch.optim.AdamW", _partial_=True, lr=3e-4))
    """Optimizer class or factory, completed with the model's parameters (Hydra ``_partial_``)."""
    lr_schedule: TargetNode = field(default_factory=lambda: TargetNode(_target_=None, _partial_=True))
    """LR scheduler class or factory, completed with the optimizer and stepped once per optimizer step;
    ``_target_: null`` = a constant learning rate."""
    grad_clip_norm: float = 0.0
    """``clip_grad_norm_`` to this norm before each optimizer step; 0 = no clipping."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step (one call of the step each; DDP syncs on the last only)."""
    float32_matmul_precision: str = "high"
    """``torch.set_float32_matmul_precision`` of the job, set in every GPU trial before the model is built:
    ``high`` (TF32 tensor cores for float32 matmuls, what a training job sets), ``highest`` (full float32,
    torch's own default) or ``medium``. CPU trials leave torch's default (torch 2.13 would also turn oneDNN's
    CPU matmuls to bf16 under ``medium``). Written into ``best_config.py`` and the exports; part of what a
    study measured on."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"workload.batch_size={self.batch_size} must be >= 1")
        if not self.seq_len or min(self.seq_len) < 2:
            raise ValueError(f"workload.seq_len={self.seq_len} needs one or more lengths >= 2, e.g. [128] or [96,128]")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("workload.nproc_per_node and workload.nnodes must be >= 1")
        if self.device not in DEVICES:
            raise ValueError(f"workload.device={self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.threads < 0:
            raise ValueError(f"workload.threads={self.threads} must be >= 0 (0 = automatic)")
        if self.grad_clip_norm < 0:
            raise ValueError(f"workload.grad_clip_norm={self.grad_clip_norm} must be >= 0 (0 = no clipping)")
        if self.float32_matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"workload.float32_matmul_precision={self.float32_matmul_precision!r}: choose one of "
                             f"{', '.join(MATMUL_PRECISIONS)}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"workload.grad_accum_steps={self.grad_accum_steps} must be >= 1 (1 = no accumulation)")
        for key in PARTS:
            target = getattr(self, key).get("_target_")
            if not (target is None and key == "lr_schedule") and (not isinstance(target, str) or "." not in target):
                raise ValueError(f"workload.{key}._target_={target!r} must be a dotted path like 'mypkg.module.name'"
                                 + (" (or null: no schedule)" if key == "lr_schedule" else ""))

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def shapes_vary(self) -> bool:
        return len(set(self.seq_len)) > 1

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_threads(self) -> int:
        # The cores this process may run on (taskset, a container's cpuset), not every core of the machine.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return self.threads or max(1, cores // self.nproc_per_node)


@dataclass
class MeasureSettings:
    """How a trial is timed."""

    warmup_steps: int = 3
    """Steps before timing; raised so every sequence length is seen twice (compiles and recompiles)."""
    windows: int = 5
    """Timed windows; the median is reported and the spread across windows shows the noise."""
    window_steps: int = 5
    """Steps per timed window; rounded up to a multiple of the number of sequence lengths, so that
    every window runs each length equally often."""
    timeout_s: float = 900.0
    """Wall-clock limit of the whole trial process tree; past it the trial is killed and failed."""
    cache: str = "cold"
    """``cold``: a fresh inductor cache per trial (what a new job pays); ``warm``: one shared cache."""
    peak_tflops: float = 0.0
    """Device peak for MFU; 0 = look it up for known GPUs (CPU MFU is not reported)."""
    precision: float = 0.02
    """After ``windows`` windows, keep timing windows until the 95% interval of the mean window step
    time is within this fraction of it (0.02 = +-2%), or ``max_timed_s`` is spent; 0 = exactly
    ``windows`` windows. The precision reached is ``timed_precision`` in result.json. It bounds the
    noise *inside* one process only: process-to-process noise is measured by the study's repeats."""
    max_timed_s: float = 10.0
    """Cap on the timed part (seconds of timed windows) while ``precision`` is not reached."""
    artifacts: str = ""
    """Compile artifacts to load before compiling (``torch.compiler.load_cache_artifacts``), e.g. a study's
    ``best_config.artifacts.bin``: measures a warm start. Empty = none."""
    launcher: str = "auto"
    """How a trial's processes start: ``auto`` runs a one-process trial (world size 1) with plain ``python``, as
    its user runs a single-process job (no torchrun agent importing torch beside it and polling while the trial
    is timed), and several under torchrun; ``torchrun`` always starts torchrun."""

    def policy(self, window_steps: int) -> WindowPolicy:
        """A trial's windows (``window_steps`` rounded by the worker): ``windows`` at least, then until
        ``precision`` or ``max_timed_s``."""
        return WindowPolicy(window_steps, self.windows, self.precision, self.max_timed_s)

    def __post_init__(self) -> None:
        if self.launcher not in ("auto", "torchrun"):
            raise ValueError(f"measure.launcher={self.launcher!r}: choose auto or torchrun")
        if self.warmup_steps < 1 or self.windows < 1 or self.window_steps < 1:
            raise ValueError("measure.warmup_steps, measure.windows and measure.window_steps must be >= 1")
        if self.timeout_s <= 0:
            raise ValueError(f"measure.timeout_s={self.timeout_s} must be > 0")
        if self.cache not in CACHE_MODES:
            raise ValueError(f"measure.cache={self.cache!r}: choose cold or warm")
        if not 0 <= self.precision < 1:
            raise ValueError(f"measure.precision={self.precision} must be in [0, 1), e.g. 0.02 for +-2% "
                             "(0 = a fixed number of windows)")
        if self.max_timed_s <= 0:
            raise ValueError(f"measure.max_timed_s={self.max_timed_s} must be > 0 (seconds of timed steps)")
        if self.artifacts and not Path(self.artifacts).is_file():
            raise ValueError(f"measure.artifacts={self.artifacts!r} is no file: give a best_config.artifacts.bin path")


@dataclass
class TrialSpec:
    """Everything a worker needs; written as ``trial.json`` in the trial directory."""

    knobs: Knobs
    model: ModelSpec
    workload: Workload
    measure: MeasureSettings
    device: str = "cpu"
    """The resolved device type."""
    threads: int = 1
    """The resolved threads per process."""

    module = "autocompile.trial.timing.worker"
    """The worker module torchrun runs on this spec."""

    def plain_python(self) -> bool:
        """One process started with plain ``python``, not torchrun (``measure.launcher=auto``, world size 1)."""
        return self.measure.launcher == "auto" and self.workload.world_size == 1

    def write(self, trial_dir: Path) -> Path:
        return write_spec(trial_dir / "trial.json", self)

    @classmethod
    def read(cls, trial_dir: Path) -> TrialSpec:
        return cls.from_dict(json.loads((trial_dir / "trial.json").read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialSpec:
        return cls(
            knobs=raw["knobs"],
            model=ModelSpec(**raw["model"]),
            workload=Workload(**raw["workload"]),
            measure=MeasureSettings(**raw["measure"]),
            device=raw["device"],
            threads=raw["threads"],
        )


@dataclass
class SideBySideSpec:
    """Several configurations of one workload timed in one process, window by window in rotating order;
    written as ``sidebyside.json`` (``python -m autocompile.trial.timing.worker DIR``)."""

    candidates: list[TrialSpec]
    """One spec per candidate: same model, workload and device; the knobs differ."""
    labels: list[str]
    """A name per candidate, in the same order."""
    policy: WindowPolicy
    """Its windows and stopping rule (``compare``'s: :meth:`CompareSettings.policy`)."""
    expected: list[str | None] = field(default_factory=list)
    """The fingerprint each candidate compiled to in its own cold trial: a candidate that compiles another
    program beside the others fails as ``not_same_program`` (None: not checked)."""
    artifacts: list[str | None] = field(default_factory=list)
    """Compile artifacts (its cold trial's ``compile_artifacts.bin``) loaded before a candidate compiles."""
    shift: int = 0
    """This process's rotation of the build and window order (processes of one comparison differ)."""
    timeout_s: float = 900.0
    """Wall-clock limit of the whole process tree."""

    module = "autocompile.trial.timing.worker"

    def plain_python(self) -> bool:
        """As :meth:`TrialSpec.plain_python`: one process, no torchrun."""
        return self.candidates[0].plain_python()

    def __post_init__(self) -> None:
        if len(self.candidates) < 2 or len(self.labels) != len(self.candidates):
            raise ValueError("a side-by-side comparison needs two or more candidates, each with a label")
        self.expected = self.expected or [None] * len(self.candidates)
        self.artifacts = self.artifacts or [None] * len(self.candidates)

    @property
    def workload(self) -> Workload:
        return self.candidates[0].workload

    @property
    def measure(self) -> MeasureSettings:
        """The first candidate's measurement settings, with this process's time limit."""
        from dataclasses import replace

        return replace(self.candidates[0].measure, timeout_s=self.timeout_s, artifacts="")

    @property
    def threads(self) -> int:
        return self.candidates[0].threads

    @property
    def device(self) -> str:
        return self.candidates[0].device

    def write(self, trial_dir: Path) -> Path:
        return write_spec(trial_dir / "sidebyside.json", self)

    @classmethod
    def read(cls, trial_dir: Path) -> SideBySideSpec:
        raw = json.loads((trial_dir / "sidebyside.json").read_text())
        raw["candidates"] = [TrialSpec.from_dict(c) for c in raw["candidates"]]
        return cls(**{**raw, "policy": WindowPolicy(**raw["policy"])})


def write_spec(path: Path, spec: TrialSpec | SideBySideSpec) -> Path:
    """A process's spec as the worker reads it (``path``)."""
    path.write_text(json.dumps(asdict(spec), indent=2, sort_keys=True))
    return path


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Readers never see a half-written file: write a sibling, then rename over."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
