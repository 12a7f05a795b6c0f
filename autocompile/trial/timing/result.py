"""What a timing process writes as ``result.json``, typed: the worker, the script meter, the side-by-side
processes, a failure and the launcher all write through :class:`TrialResult`, so one declaration says what each
key means, and every reader (the study's phases, ``task=compare``, the tests) reads its fields, not string keys.

The stored shape is the one every record under ``benchmarks/`` has: each field is the JSON key of the same
name; ``to_json`` leaves out the fields a producer did not set (None in a field that only some producers
write), and keys this version does not know (from a newer one) are kept in ``extra`` and written back.
The tuner reads the subset it ranks by as :class:`autocompile.study.records.record.Measurement`.
Standard library only: it runs in the trial's process, which holds nothing but PyTorch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

SOMETIMES = frozenset({"failure", "reason", "rank", "sharded", "script", "optimizer_steps", "flops_source",
                       "recompile_reasons", "dynamo_compile_s", "compile_artifacts", "artifacts_loaded",
                       "label", "warm_s", "stalled_windows", "candidates", "order", "rounds",
                       "wall_s", "trial_dir", "resources", "lease", "compile_cpu_s"})
"""Fields only some producers or outcomes write: left out of the JSON when None (a failure has no
``sharded``, a model trial no ``script``). Every other field of a one-candidate process is written, None
included, as the worker always wrote it; a side-by-side process and each of its candidates write only what they
set."""


class Environment(TypedDict, total=False):
    """Where a process ran (``readings.environment``): rank 0's, kept on every trial."""

    torch: str
    python: str
    device: str | None
    """``cpu`` or ``cuda``; None in a failure written before the device was known."""
    device_name: str
    """The GPU's name (``NVIDIA H100 80GB HBM3``), or the CPU's."""
    world_size: int
    threads: int
    """Intra-op threads (``torch.get_num_threads()``)."""
    hostname: str
    rank: int
    cpus: list[int]
    """The CPUs the process may run on."""
    cuda_visible_devices: str | None


class Artifacts(TypedDict, total=False):
    """Compile artifacts saved (``compile_artifacts.save_artifacts``) or loaded (``load_artifacts``)."""

    path: str
    """The ``compile_artifacts.bin`` file."""
    bytes: int
    """Its size (saved ones)."""
    entries: dict[str, int]
    """Entries by kind (``inductor``, ``aot_autograd``, ``dynamo``...)."""


class Failure(TypedDict):
    """What ended a run that failed (``readings.classify``)."""

    failure: str
    reason: str


class ProgressEvent(TypedDict, total=False):
    """One line of a process's ``progress.jsonl`` (``build.append_progress``), read by the launcher's stop rules
    and the live view while the process runs: ``event`` names it, and only that event's keys are there."""

    event: str
    """``started``, ``warmup_start``, ``warmup_step``, ``compiled``, ``rewarm``, ``window``; side by side
    ``candidate_start``, ``candidate_ready``, ``round``."""
    time: float
    """Wall clock of the line (``time.time()``)."""
    steps: int
    """``warmup_start``: the warm-up's planned steps; ``rewarm``: the script's steps run again."""
    step: int
    """``warmup_step``: its index."""
    seconds: float
    """``warmup_step``: its wall seconds; ``window``: the window's."""
    frames: int
    """``rewarm``: frames compiled in the first timed window."""
    window: int
    """``window``: its index."""
    step_s: float | dict[str, float]
    """``window``: seconds per step; ``round`` (side by side): each candidate's, by label."""
    fingerprint: str
    """``compiled`` (and a script's ``candidate_ready``): the program's fingerprint."""
    coverage: float
    """``compiled``: the share of weights compiled."""
    candidate: int
    """Side by side: the candidate's index."""
    label: str
    """Side by side: the candidate's label."""
    status: str
    """``candidate_ready``: ``ok`` or ``failed``."""
    round: int
    """``round``: its index."""


@dataclass
class TrialResult:
    """One timing process's outcome: ``ok`` with its measurement, or ``failed`` with its kind and reason."""

    status: str = "ok"
    """``ok`` or ``failed``; the launcher's own: ``pruned``, ``same_program`` or ``interrupted`` (stopped)."""
    failure: str | None = None
    """A failed run's kind (``oom``, ``crash``, ``graph_break``, ``compile_in_timed_part``...)."""
    reason: str | None = None
    """Why it failed, in words (the first lines of the exception, not the traceback)."""
    rank: int | None = None
    """The rank that wrote a failure (``error.rankN.json`` for ranks other than 0)."""
    compiled: list[str] | None = None
    """What was compiled (``model``, ``blocks``, ``optimizer``...): empty for an eager run."""
    sharded: list[str] | None = None
    """What FSDP2 sharded (the model path)."""
    compile_s: float | None = None
    """The warm-up's wall seconds beyond what its steps cost at the steady state (less what the lease paused of it;
    with other processes in flight, a lone run's estimate: ``lease["compile_wall_s"]`` keeps the wall one)."""
    compile_cpu_s: float | None = None
    """CPU seconds of the process tree (inductor's compile workers included) over the warm-up, beyond what its
    steps cost at the steady state: what another process compiling beside it does not change."""
    first_step_s: float | None = None
    """Wall seconds of the first warm-up step."""
    warmup_step_s: list[float] | None = None
    """Wall seconds of each warm-up step (the slowest rank's)."""
    dynamo_compile_s: dict[str, float] | None = None
    """Dynamo's own accounting (``torch._dynamo.utils.compile_times``)."""
    step_s: float | None = None
    """Median seconds per step over the timed windows."""
    step_s_windows: list[float] | None = None
    """Each timed window's seconds per step, in order."""
    step_cpu_s_windows: list[float] | None = None
    """Each window's process CPU seconds per step (the busiest rank's): a stall shows as wall without CPU."""
    step_s_cv: float | None = None
    """The windows' spread (coefficient of variation) inside the process."""
    timed_precision: float | None = None
    """Half-width of the 95 % interval of the mean window, relative (inside this process)."""
    timed_s: float | None = None
    """Wall seconds of the timed windows."""
    windows: int | None = None
    """Timed windows."""
    tokens_per_s: float | None = None
    """Median throughput over the windows, every rank's items counted."""
    tokens_per_s_windows: list[float] | None = None
    """Each window's throughput: its items (all ranks) over its seconds."""
    throughput_unit: str | None = None
    """``tokens``, ``samples`` (image inputs) or ``optimizer steps`` (a script whose forward was not seen)."""
    peak_memory_bytes: int | None = None
    """Peak memory of the timed part (CUDA allocator, or the process's maximum RSS on a CPU)."""
    warmup_peak_memory_bytes: int | None = None
    """Peak memory of the warm-up (compile, autotuning)."""
    memory_source: str | None = None
    """Where the peaks come from (``cuda_allocator``, ``max_rss``...)."""
    graph_count: int | None = None
    """Distinct graphs dynamo compiled."""
    graph_breaks: int | None = None
    """Graph breaks during the run."""
    graph_break_reasons: dict[str, int] | None = None
    """Each graph break's reason, shortened, with its count."""
    recompiles_timed: int | None = None
    """Recompiles (or CUDA-graph recordings) in the timed part after its one re-warm."""
    recompile_reasons: list[str] | None = None
    """The guards that failed in the timed part (``forward (model.py:41): 0/0: tensor 'x' size mismatch...``)."""
    rewarm_steps: int | None = None
    """Steps run again as warm-up after a recompile in the first timed window."""
    compiled_coverage: float | None = None
    """Share of the model's weights inside a compiled graph."""
    fingerprint: str | None = None
    """The compiled program's fingerprint: equal fingerprints, the same program."""
    losses: list[float] | None = None
    """Loss per step, warm-up included, for the numerics check."""
    warmup_steps: int | None = None
    """Warm-up steps run, re-warm included."""
    window_steps: int | None = None
    """Steps per timed window."""
    mfu: float | None = None
    """Model FLOPs utilisation against the device's peak; None without a known peak."""
    flops_per_token: float | None = None
    """Model FLOPs per item of one training step."""
    flops_source: str | None = None
    """``counted`` (FlopCounterMode) or ``6N estimate``."""
    compile_artifacts: Artifacts | None = None
    """The saved compile artifacts (``compile_artifacts.bin``) of a compiled run, rank 0."""
    artifacts_loaded: Artifacts | None = None
    """What loading the given compile artifacts did (a warm start)."""
    param_checksums: list[float] | None = None
    """Each rank's parameter checksum after the burst (they must agree)."""
    script: dict[str, Any] | None = None
    """A script trial's own facts: path, args, optimizer steps, compile calls, what ``prepare()`` applied."""
    optimizer_steps: int | None = None
    """A failed script trial: the optimizer steps it took before failing."""
    timeline: dict[str, float] | None = None
    """Wall-clock marks of the process (launch, build done, warm-up done, timed done)."""
    environment: Environment | None = None
    """The process's torch, device, threads and versions."""
    label: str | None = None
    """Side by side, one candidate's outcome: its label."""
    warm_s: float | None = None
    """Side by side, one candidate: wall seconds of its build and warm-up beside the others."""
    stalled_windows: int | None = None
    """Side by side, one candidate: windows left out of ``step_s`` as descheduled."""
    candidates: list[TrialResult] | None = None
    """A side-by-side process: each candidate's outcome, in the candidates' order."""
    order: list[int] | None = None
    """A side-by-side process: the order its candidates were built and warmed up in."""
    rounds: int | None = None
    """A side-by-side process: the rounds of windows it timed."""
    wall_s: float | None = None
    """The launcher's: wall seconds from launch to result, whatever ended the process."""
    trial_dir: str | None = None
    """The launcher's: the directory the process ran in (its logs, inductor cache, compile artifacts)."""
    resources: dict[str, list[int]] | None = None
    """The launcher's: the CPUs and GPUs it was pinned to (``cpus``, ``gpus``), when it was."""
    lease: dict[str, Any] | None = None
    """The launcher's: seconds paused while another process timed (``paused_s``, ``pauses``; ``compile_paused_s``
    of them in its warm-up, taken out of ``compile_s``), waiting for its turn on the device (``waited_s``), and
    compiling while another process in flight on this machine ran too (``shared_compile_s``): ``trial.lease``; with
    ``compile_wall_s`` and ``compile_basis`` when ``compile_s`` is a lone run's estimate
    (``study.records.lone_compile``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not declare (from a newer one, or the launcher's own): kept and written back."""

    @classmethod
    def failed(cls, failure: Failure, rank: int, environment: Environment, **more: Any) -> TrialResult:
        """A failure: ``failure`` holds its kind (``failure``) and ``reason`` (``readings.classify``)."""
        return cls(status="failed", failure=failure.get("failure"), reason=failure.get("reason"), rank=rank,
                   environment=environment, **more)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialResult:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        if "coverage" in data and "compiled_coverage" not in data:  # a side-by-side candidate's name for it
            data = {("compiled_coverage" if k == "coverage" else k): v for k, v in data.items()}
        known = {k: v for k, v in data.items() if k in names}
        if known.get("candidates") is not None:
            known["candidates"] = [cls.from_json(c) for c in known["candidates"]]
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def sparse(self) -> bool:
        """Written with only what was set: a failure or stop, a side-by-side process and its candidates."""
        return self.status != "ok" or self.candidates is not None or self.label is not None

    def to_json(self) -> dict[str, Any]:
        """The ``result.json`` mapping; a failure carries only what was set."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and (f.name in SOMETIMES or self.sparse)):
                continue
            out[f.name] = [c.to_json() for c in value] if f.name == "candidates" else value
        return {**out, **self.extra}
