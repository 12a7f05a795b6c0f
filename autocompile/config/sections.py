"""The study's own sections of the configuration (``study.*``, ``objective.*``, ``tracking.*``,
``launch.*``): typed, with a docstring per field and a fix in every error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocompile.config.knobs import KNOBS

OBJECTIVES = ("time_to_train", "throughput", "pareto")
SAMPLERS = ("staged", "tpe", "random", "gp", "every")
START_PRECISIONS = ("auto", "none", "bfloat16", "float16")
"""``study.sampler`` values (:mod:`autocompile.study.search.samplers` builds them)."""


@dataclass
class StudySettings:
    """The Optuna study."""

    name: str = "${ac_job:}-ws${ac_ws:}-${ac_device:${workload.device}}${ac_fixed:}"
    """Study (and run directory) name; the same name resumes the same study. The default names the
    model and workload (or the script and a hash of its arguments), then what the study fixes
    (``+compile.mode=max-autotune``, a non-default objective), so each job of a sweep over those is a study
    of its own."""
    storage: str = ""
    """Optuna storage URL (``postgresql://...``), or the path of a journal file (no URL scheme); empty =
    a journal file in the run directory."""
    n_trials: int = 10
    """Trials to finish (complete, pruned or failed), counting those of a resumed study. 10: the staged plan
    reaches the best of both CPU tables of programs by its eighth trial (replayed, 50 seeds: 49/50 and 50/50
    within 2 % at 10 trials and the re-measures, 47/50 at 20; ``benchmarks/results/cpu-2core/
    replay_default_10_trials.txt``), and the verdicts then ask every one-knob move at the winner."""
    timeout_s: float = 0.0
    """Stop starting trials after this many seconds; 0 = no limit."""
    seed: int = 0
    """Sampler seed."""
    sampler: str = "staged"
    """Search strategy: ``staged`` (where a practitioner starts: eager, module, regional and the compiled train
    step in ``study.start_precision``; then mixed precision, checkpointing and the optimizer implementation one
    at a time on the leading program, compiled and eager; then the compiled knobs one at a time; then TPE),
    ``tpe``, ``random``, ``gp`` (Optuna's GPSampler), or ``every`` (each configuration once: the tabular
    benchmark). ``docs/study.md``, "The plan", says why; ``docs/benchmarks.md``, "Search strategy", how they
    compare."""
    start_precision: str = "auto"
    """The mixed precision (``amp.dtype``) of the first trials (the baselines and the first compiled train step):
    ``auto`` = ``bfloat16`` on a GPU that runs it natively (compute capability 8.0+, where practitioners train in
    bf16 autocast), none (fp32) elsewhere; or ``none``, ``bfloat16``, ``float16``. A fixed ``amp.dtype`` wins.
    The other precisions are measured later, as one-knob changes of the leading programs."""
    extended: bool = False
    """Also search the extended knobs (inductor options)."""
    baselines: bool = True
    """Measure eager, default torch.compile(model) and regional compile before sampling."""
    prune: bool = True
    """Stop trials that cannot beat the best (by compile time, or after the first timed windows)."""
    max_failure_rate: float = 0.8
    """Stop the study when more than this fraction of its trials failed (after 5 trials)."""
    heartbeat_s: int = 30
    """RDB storages: a tuner's heartbeat period; a trial silent for 3 periods is failed and re-queued."""
    confirm_top: int = 5
    """After the search, race this many of its best distinct programs against eager and default
    torch.compile(model), ``repeats`` rounds in fresh processes, interleaved; the winner is decided
    on those repeats. 0 = no confirmation (the search's single measurements decide). 5, not 3: the
    search ranks single measurements 8.6 % apart in noise, and the replay of the gpt2-tiny table with the
    tuner's rules found the best within 2 % in 39/50 seeds with 3, 47/50 with 5
    (benchmarks/results/cpu-2core/replay_search_gpt2-tiny_confirm_top.txt)."""
    remeasure_pruned: int = 2
    """After the search, measure this many near-miss prunes once more (closest to the margin first; a prune
    is one noisy window, provisional until a second says the same: ``objective.near_misses``). Each is a
    search trial beyond ``n_trials``. 0 = every prune is final."""
    repeats: int = 3
    """Rounds of the confirmation and verdict phases when they run in fresh processes (each round every
    candidate once, in a process of its own). Side by side, ``compare.processes`` processes each time
    every candidate in rotating windows. Not counted in n_trials."""
    side_by_side: bool = True
    """The phases time their candidates side by side in one process (paired windows, far less noise
    than one process per candidate); false, or candidates that cannot share a process, fall back to
    one fresh process per candidate and round, and the report says which ran and why."""
    verdicts: Any = "auto"
    """Questions answered by measuring the winner's one-knob neighbours in rounds with it: ``auto`` (every
    searched knob with a question that can change the recommendation at the winner: activation checkpointing,
    which only trades step time for memory, is asked where memory binds, ``objective.memory_limit_gb`` set or
    the winner checkpointing; the report says what was not asked and why), ``all`` (every searched knob with a
    question), ``none``, or a list of knob keys ([amp.placement,compile.mode])."""
    warm_start: bool = True
    """Keep the winner's compile artifacts next to best_config.py (which loads them) and measure once
    more, in a fresh process with them loaded, how much compile time that warm start saves."""
    repeat_cache: str = "warm"
    """``warm``: a repeat reuses its configuration's own inductor cache (from its first, cold run), so
    its steps are timed in a fresh process after a cheap compile; compile time is the cold run's.
    ``cold``: every repeat compiles cold."""
    reuse: str = "auto"
    """``auto``: a fresh study starts from the newest answer the tracking store (or ``reuse_from``) holds for this
    job: an exact one (the same model, workload, objective, device and versions) has its recommendation re-verified
    side by side against eager and default compile and the study stops there; a related one (the same model and
    device) has its best configurations measured first. ``off``: every study starts from nothing."""
    reuse_from: str = ""
    """An ``answer.json`` a finished study wrote in its run directory (for a machine with no shared store): the
    answer ``reuse`` starts from instead of the store's."""

    def __post_init__(self) -> None:
        if self.n_trials < 1:
            raise ValueError(f"study.n_trials={self.n_trials} must be >= 1")
        if self.remeasure_pruned < 0:
            raise ValueError(f"study.remeasure_pruned={self.remeasure_pruned} must be >= 0 (0 = every prune is final)")
        if self.confirm_top < 0:
            raise ValueError(f"study.confirm_top={self.confirm_top} must be >= 0 (0 = no confirmation phase)")
        if self.reuse not in ("auto", "off"):
            raise ValueError(f"study.reuse={self.reuse!r}: choose auto or off")
        if self.reuse_from and not Path(self.reuse_from).is_file():
            raise ValueError(f"study.reuse_from={self.reuse_from}: no such file; give the answer.json a finished "
                             "study wrote in its run directory")
        if self.repeats < 1:
            raise ValueError(f"study.repeats={self.repeats} must be >= 1 (2 or more give intervals)")
        if self.start_precision not in START_PRECISIONS:
            raise ValueError(f"study.start_precision={self.start_precision!r}: choose one of "
                             f"{', '.join(START_PRECISIONS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"study.sampler={self.sampler!r}: choose one of {', '.join(SAMPLERS)}")
        if self.repeat_cache not in ("warm", "cold"):
            raise ValueError(f"study.repeat_cache={self.repeat_cache!r}: choose warm or cold")
        if not 0 < self.max_failure_rate <= 1:
            raise ValueError(f"study.max_failure_rate={self.max_failure_rate} must be in (0, 1]")
        self.verdicts = self.verdict_keys_checked(self.verdicts)

    @staticmethod
    def verdict_keys_checked(value: Any) -> Any:
        if value in ("auto", "all", "none"):
            return value
        keys = [value] if isinstance(value, str) else list(value)
        unknown = [k for k in keys if k not in KNOBS or not KNOBS[k][0].question]
        if unknown:
            asked = ", ".join(k for k, (spec, _) in KNOBS.items() if spec.question)
            raise ValueError(f"study.verdicts: {unknown[0]!r} is no knob with a question; use auto, all, none or a "
                             f"list of: {asked}")
        return keys

    def verdict_knobs(self) -> list[str] | None:
        """Knob keys whose verdicts are measured: None = all (``auto``: all that can change the recommendation,
        :func:`autocompile.study.phases.plans.asked`), [] = none."""
        return self.knobs_of(self.verdicts)

    @staticmethod
    def knobs_of(verdicts: Any) -> list[str] | None:
        """:meth:`verdict_knobs` of a ``study.verdicts`` value."""
        return None if verdicts in ("all", "auto") else [] if verdicts == "none" else list(verdicts)


@dataclass
class LaunchSettings:
    """Where trials run: parallel slots on this machine, and the agents of multi-node trials."""

    slots: int = 0
    """Trials at once on this machine, each on its own GPUs (or CPU cores); 0 = visible GPUs //
    world size on CUDA, 1 on CPU (concurrent CPU trials disturb each other's timings)."""
    concurrency: int = 0
    """Trial processes in flight per slot: the next candidates start, build and compile while one is timed, which
    holds the device alone (the machine's lease: every other trial process on the machine is paused meanwhile).
    0 = automatic (from the cores, and the memory the reference run's peak leaves room for); 1 = one at a time."""
    rdzv_host: str = "127.0.0.1"
    """Rendezvous host of multi-node trials: this machine's address as the other nodes see it."""
    remote_agent: str = ""
    """Command template starting the torchrun agent of each further node of a multi-node trial,
    ``{cmd}`` being the torchrun command (e.g. ``srun --nodes=1 --ntasks=1 {cmd}``); empty = all
    agents on this machine."""
    worker: int = 0
    """Index of this tuner process when several cooperate on one study (a SLURM job array)."""

    def __post_init__(self) -> None:
        if self.slots < 0:
            raise ValueError(f"launch.slots={self.slots} must be >= 0 (0 = automatic)")
        if self.concurrency < 0:
            raise ValueError(f"launch.concurrency={self.concurrency} must be >= 0 (0 = automatic, 1 = one at a time)")


@dataclass
class ObjectiveSettings:
    """What "best" means."""

    kind: str = "time_to_train"
    """time_to_train: compile s + horizon_steps x step s (minimise); throughput: tokens/s (maximise);
    pareto: tokens/s up and compile s down."""
    horizon_steps: int = 10000
    """Training steps the compile time is paid back over (time_to_train): the length of the job."""
    memory_limit_gb: float = 0.0
    """Trials above this peak memory are infeasible; 0 = no limit."""
    loss_rtol: float = 0.02
    """Per-step losses must stay within this relative distance of the eager reference's."""
    compile_cv: float | None = None
    """Prior relative sd of one cold compile across fresh processes, which time-to-train intervals pool with the
    spread the study measures (weighted by degrees of freedom); null = the device class's (CPU 10 %: 13 committed
    studies' cold compiles pooled; CUDA 10 %), learned further from the earlier studies under ``output_root`` on
    this device (``study/records/compile_prior.py``)."""
    compile_df: int | None = None
    """Degrees of freedom the prior counts as (its weight against the study's own cold compiles); null = the
    device class's (CPU 8, CUDA 2)."""
    tie_margin: float = 0.02
    """Equivalence margin of the confirmation: a candidate ties with the leader when the 95% interval of
    their ratio (of the objective's score) lies within +-this; one whose interval straddles it is
    "undetermined" (never recommended over the leader; the report says how many more processes would
    decide it)."""
    loss_steps: int = 28
    """How many first steps' losses are compared (the default burst: 3 warm-up + 5 x 5 timed steps).
    Correct programs agree to ~1e-7 there, then drift apart as rounding differences compound (a ViT
    that overfits its batches: past 2% after ~180 steps); comparing every step would fail the fast
    configurations, which run more steps in the same timed seconds."""

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise ValueError(f"objective.kind={self.kind!r}: choose one of {', '.join(OBJECTIVES)}")
        if self.horizon_steps < 1:
            raise ValueError(f"objective.horizon_steps={self.horizon_steps} must be >= 1")
        if self.compile_cv is not None and not 0 <= self.compile_cv < 1:
            raise ValueError(f"objective.compile_cv={self.compile_cv} must be in [0, 1), e.g. 0.06")
        if self.compile_df is not None and self.compile_df < 1:
            raise ValueError(f"objective.compile_df={self.compile_df} must be >= 1, e.g. 4")
        if not 0 < self.tie_margin < 1:
            raise ValueError(f"objective.tie_margin={self.tie_margin} must be in (0, 1), e.g. 0.02")
        if self.loss_steps < 2:
            raise ValueError(f"objective.loss_steps={self.loss_steps} must be >= 2: the first step's loss is "
                             "computed before any update, so it cannot tell a step that does not train")


@dataclass
class TrackingSettings:
    """MLflow."""

    enabled: bool = True
    """Log the study to MLflow."""
    uri: str = ""
    """Tracking URI; empty = sqlite:///<output_root>/mlflow.db (studies accumulate side by side)."""
    experiment: str = ""
    """Experiment name; empty = one per model (autocompile/<model>), its studies and multirun jobs side by side."""


@dataclass(frozen=True)
class Resources:
    """What one trial slot may use; empty means inherit the tuner's."""

    cpus: tuple[int, ...] = ()
    """CPU affinity of the trial's process tree (workers inherit it)."""
    gpus: tuple[str, ...] = ()
    """GPUs the trial sees (CUDA_VISIBLE_DEVICES)."""
