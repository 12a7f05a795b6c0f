"""Run candidates side by side: fresh processes that each time every candidate in rotating windows.

The tuner-side half of :mod:`autocompile.trial.timing.sidebyside_worker`: which candidates may share a process, the
spec of each process (build and window order rotated per process), and the paired intervals of every
candidate against one of them (:mod:`autocompile.study.statistics.intervals`). Used by ``task=compare`` and by
the confirmation and verdict phases.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from autocompile.config.choices import compiles
from autocompile.config.gpus import free_memory
from autocompile.config.knobs import PREPARE_OPENS, TrialConfig
from autocompile.config.script_settings import ScriptRotation, ScriptSpec
from autocompile.config.sections import Resources
from autocompile.config.settings import Settings
from autocompile.config.spec import SideBySideSpec
from autocompile.study.statistics.noise import ChangePoint, change_point
from autocompile.trial.launcher import Agents, launch
from autocompile.trial.slots import slot_threads
from autocompile.trial.timing.result import ProgressEvent, TrialResult
from autocompile.trial.timing.shape_state import SHAPE_STATE_FILE
from autocompile.trial.timing.stats import descheduled

log = logging.getLogger(__name__)
MEMORY_SHARE = 0.8
"""Candidates share a process when their cold peaks together stay under this share of what is free."""


@dataclass
class Member:
    """A candidate of a side-by-side process."""

    label: str
    config: TrialConfig
    cold: TrialResult
    """Its cold single-candidate trial's result: fingerprint, compile artifacts, peak memory, compile time."""


def cannot_share(members: list[Member], settings: Settings, gpu: str | None = None) -> str | None:
    """Why these candidates cannot share one process (None: they can). ``gpu``: the GPU it would run on (default:
    the first visible one, where the phases' slot and a process without a slot run).

    Found by test on CPU (tests/test_sidebyside_knobs.py): every knob value of the CPU space scopes to its
    own candidate but one, regional compile with per-block checkpointing beside another compiled
    candidate; the fingerprint check catches any other. Not testable without a GPU: CUDA graph trees
    (one memory pool per device, shared by every recorded graph), so those fall back."""
    script = getattr(settings, "script", None)  # settings stand-ins of tests have no script section
    if script is not None and script.given and (why := script_cannot_share(members, settings)) is not None:
        return why
    if settings.device == "cuda":
        from autocompile.trial.program.step import compile_kwargs, uses_cuda_graphs

        graphs = [m.label for m in members if compiles(m.config.compile.scope)
                  and uses_cuda_graphs(compile_kwargs(m.config.compile))]
        if graphs:
            return (f"{', '.join(graphs)} record CUDA graphs, whose trees share one memory pool per device "
                    "(untested side by side)")
    compiled = [m for m in members if compiles(m.config.compile.scope)]
    wrapped = [m.label for m in compiled if m.config.compile.scope == "regional" and m.config.ac.policy == "block"]
    if wrapped and len(compiled) > 1:
        # Found by test (tests/test_sidebyside_knobs.py): each block's checkpoint wrapper is one code object
        # for every candidate, and what dynamo keeps per code object from one candidate's compile changed
        # the next one's program (even an identical candidate's).
        return (f"{', '.join(wrapped)} compile(s) per-block checkpoint wrappers, whose dynamo state other "
                "compiled candidates in the process change")
    need = sum(float(m.cold.peak_memory_bytes or 0) for m in members)
    free = _free_memory(settings.device, gpu)
    if free and need > MEMORY_SHARE * free:
        return (f"the candidates' peak memory together ({need / 2**30:.1f} GiB) does not fit "
                f"({free / 2**30:.1f} GiB free)")
    return None


def script_cannot_share(members: list[Member], settings: Settings) -> str | None:
    """Why a script's candidates cannot share one of its processes (None: they can). The agent switches, per
    window, which candidate's compile of the model's units runs (:mod:`autocompile.trial.script.variants`): what
    changes only what is compiled and how shares (scope, mode, options, dynamic, fullgraph, backend); what is
    applied once to the script's own objects does not."""
    if settings.workload.world_size > 1:
        return ("a script on several ranks: its candidates switch inside one process only (the script wraps "
                "the compiled model in DDP once)")
    functions = sorted({c["target"] for m in members for c in (m.cold.script or {}).get("compile_calls", [])
                        if not c.get("module", True)})
    if functions:
        return (f"the script compiles the function(s) {', '.join(functions)}: each is compiled once, where the "
                "script compiles it, not switched per window")
    for key in PREPARE_OPENS:
        values = sorted({str(m.config.flat().get(key)) for m in members})
        if len(values) > 1:
            return (f"{key} differs ({', '.join(values)}): autocompile.prepare applies it once to the script's "
                    "own objects, outside the compiled forward")
    compiled = {_units(m.config) for m in members if compiles(m.config.compile.scope)}
    if any("granularity=nested" in u for u in compiled):
        return "nested compile regions mark every block's forward once, for every candidate"
    return None


def _units(config: TrialConfig) -> str:
    c = config.compile
    return f"scope={c.scope}" if c.scope != "regional" else \
        f"scope=regional, granularity={c.granularity}, rest={c.rest}"


def _free_memory(device: str, gpu: str | None = None) -> float | None:
    if device == "cuda":
        # The GPU the process will run on, read without a CUDA context in the tuner (config/gpus.py).
        return free_memory(gpu)
    import psutil

    # CPU peaks are process RSS, torch's own ~0.5 GiB counted once per candidate: an overestimate.
    return float(psutil.virtual_memory().available)


def spec_for(members: list[Member], settings: Settings, shift: int, threads: int | None = None,
             warm: set[str] | None = None) -> SideBySideSpec:
    """``warm``: labels whose cold cache is in the process's cache directory (no artifacts to load)."""
    c = settings.compare
    warm = warm or set()
    return SideBySideSpec(
        candidates=[settings.trial_spec(m.config, threads) for m in members], labels=[m.label for m in members],
        expected=[m.cold.fingerprint for m in members],
        artifacts=[None if m.label in warm else (m.cold.compile_artifacts or {}).get("path") for m in members],
        policy=c.policy(), shift=shift, timeout_s=max(settings.timeout_s(m.config) for m in members))


def script_spec_for(members: list[Member], settings: Settings, shift: int, threads: int | None = None,
                    warm: set[str] | None = None) -> ScriptSpec:
    """A process of the user's script that times every member side by side (``ScriptSpec.rotation``); the
    knobs ``prepare()`` applies are the members' one value (:func:`script_cannot_share`)."""
    model_path = spec_for(members, settings, shift, threads, warm)
    spec = settings.trial_spec(members[0].config, threads)
    assert isinstance(spec, ScriptSpec)
    spec.measure = replace(spec.measure, timeout_s=model_path.timeout_s)
    spec.rotation = ScriptRotation(
        knobs=[m.config.flat() for m in members], labels=model_path.labels, expected=model_path.expected,
        artifacts=model_path.artifacts, shape_states=[_shape_state(m) for m in members],
        policy=model_path.policy, shift=shift)
    return spec


def _shape_state(member: Member) -> str | None:
    path = Path(member.cold.trial_dir or "") / SHAPE_STATE_FILE
    return str(path) if member.cold.trial_dir and path.is_file() else None


def run_process(out_dir: Path, members: list[Member], settings: Settings, shift: int,
                resources: Resources | None = None, agents: Agents | None = None,
                beat: Callable[[], None] | None = None) -> TrialResult:
    """One fresh process timing every member; its ``result.json`` (``candidates`` in members' order).
    ``beat`` is called while it runs (the members' trial heartbeats: a long process is never found stale)."""
    resources, agents = resources or Resources(), agents or Agents()
    cache = out_dir / "inductor_cache"
    warm = merge_caches(members, cache)
    threads = slot_threads(settings, resources)
    spec = (script_spec_for if settings.script.given else spec_for)(members, settings, shift, threads, warm)
    log.info("side by side, process %d: %s", shift, ", ".join(m.label for m in members))

    def alive(events: list[ProgressEvent], elapsed: float) -> None:
        if beat is not None:
            beat()

    try:
        return launch(out_dir, spec, cache_dir=cache, should_stop=alive, resources=resources, agents=agents)
    finally:
        # Hard links to the cold caches, and what this process added: never read again, and the links alone
        # would keep a pruned cold cache's files on disk (study/search/warmstart.py: prune_caches).
        shutil.rmtree(cache, ignore_errors=True)


def merge_caches(members: list[Member], cache: Path) -> set[str]:
    """One inductor cache for the process, holding each member's cold cache (hard links: entries are
    named by their hash and written by rename, never in place). A warm cache directory makes a warm
    start cheap (gpt2-tiny on 2 cores: about 4 s against 16 s with ``load_cache_artifacts`` alone, whose
    first step still traces and partitions). Returns the labels whose cache was found."""
    found = set()
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    merged: set[Path] = set()
    for m in members:
        src = Path(m.cold.trial_dir or "") / "inductor_cache"
        if not m.cold.trial_dir or not src.is_dir():
            continue
        found.add(m.label)
        if src.resolve() not in merged:  # an A/A comparison names one cold run twice
            merged.add(src.resolve())
            shutil.copytree(src, cache, dirs_exist_ok=True, copy_function=_link_or_copy)
    return found


def windows(results: list[TrialResult], cpu: bool = False) -> dict[str, dict[int, list[float]]]:
    """label -> process -> window step times, from each process's result (``cpu``: their CPU seconds per step,
    where the process recorded them)."""
    found: dict[str, dict[int, list[float]]] = {}
    for p, result in enumerate(results):
        for c in result.candidates or []:
            if c.ok and c.label and (seconds := c.step_cpu_s_windows if cpu else c.step_s_windows):
                found.setdefault(c.label, {})[p] = seconds
    return found


def speed_changes(per: dict[str, dict[int, list[float]]], cpu: dict[str, dict[int, list[float]]] | None = None
                  ) -> list[tuple[str, int, ChangePoint]]:
    """(label, process, change) for every candidate whose windows changed speed within a process
    (:func:`change_point`): its process's mean then blends two speeds, which a ratio beside another candidate
    that did not change hides."""
    found = []
    for label, processes in per.items():
        for p, w in sorted(processes.items()):
            if (c := change_point(w, (cpu or {}).get(label, {}).get(p))) is not None:
                found.append((label, p, c))
    return found


def not_shared(results: list[TrialResult]) -> str | None:
    """A process or candidate that failed beside the others (the reason), or None."""
    for p, result in enumerate(results):
        if not result.ok:
            return f"process {p} failed: {result.failure}: {(result.reason or '')[:200]}"
        for c in result.candidates or []:
            if not c.ok:
                return f"{c.label} failed beside the others ({c.failure}: {(c.reason or '')[:200]})"
    return None


def step_s(per_process: dict[int, list[float]], cpu: dict[int, list[float]] | None = None) -> float:
    """A candidate's step time: the mean over processes of each process's geometric mean window (descheduled
    windows left out: ``cpu``, process -> CPU seconds of the windows; without, the wall-clock stall rule)."""
    def mean(p: int, w: list[float]) -> float:
        out = descheduled(w, (cpu or {}).get(p))
        return math.exp(statistics.fmean(math.log(x) for k, x in enumerate(w) if k not in out))

    return statistics.fmean(mean(p, w) for p, w in per_process.items())


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link (another file system: copy); an entry another candidate's cache already holds is the
    same content (entries are named by their hash): kept."""
    import os

    if os.path.exists(dst):
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
