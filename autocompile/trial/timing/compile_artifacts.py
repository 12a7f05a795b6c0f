"""Take the winner home warm: its compile artifacts, and what loading them saves, measured.

Each compiled trial saves ``torch.compiler.save_cache_artifacts()`` (inductor's FX graphs, AOT
autograd entries, autotuning results of everything it compiled) next to its result. After a study
the winner's file is copied to the run directory beside ``best_config.py``, which loads it with
``torch.compiler.load_cache_artifacts()`` before compiling, and the winner is measured once more in
a fresh process with a cold inductor cache and the artifacts loaded: the compile time that run
reports, against the winner's cold one, is what a warm start saves. Checked on torch 2.13 with
autocompile's recording backend in front of inductor (both inductor and AOT autograd artifacts are
kept; a tiny model's first step went from 15.7 s to 8.5 s on the 2-core CPU, the rest being
dynamo's tracing, which no cache skips). ``aot_eager``/``eager`` trials have no artifacts.

This module is the worker side (:func:`save_artifacts`, :func:`load_artifacts`; torch only) and the
report's line; the study side, copying and measuring, is :mod:`autocompile.study.search.warmstart`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from autocompile.trial.timing.result import Artifacts

log = logging.getLogger(__name__)

ARTIFACTS = "best_config.artifacts.bin"
"""The winner's artifacts in the run directory, next to ``best_config.py``."""
TRIAL_FILE = "compile_artifacts.bin"


def save_artifacts(trial_dir: Path) -> Artifacts | None:
    """Write this process's compile artifacts to the trial directory; None when there are none."""
    import torch

    saver = getattr(torch.compiler, "save_cache_artifacts", None)
    saved = saver() if saver is not None else None
    if not saved or not saved[0]:
        return None
    data, info = saved
    path = trial_dir / TRIAL_FILE
    path.write_bytes(data)
    return {"path": str(path), "bytes": len(data), "entries": {k: len(v) for k, v in _entries(info).items()}}


def load_artifacts(path: str) -> Artifacts:
    """Load artifacts before anything compiles; what was loaded, by kind."""
    import torch

    info = torch.compiler.load_cache_artifacts(Path(path).read_bytes())
    return {"path": path, "entries": {k: len(v) for k, v in _entries(info).items()}}


def _entries(info: Any) -> dict[str, list[Any]]:
    return dict(getattr(info, "artifacts", None) or {})


class WarmStart(TypedDict):
    """The winner's warm start as the study keeps it (``study/search/warmstart.py``; the ``warm_start`` study
    attribute and ``summary.json``)."""

    artifacts: str
    """The artifacts copied next to ``best_config.py``."""
    trial: int
    """The winner's trial number."""
    status: str
    """``ok``, or ``failed`` (see ``reason``)."""
    cold_compile_s: float
    """The winner's own compile time, cold."""
    warm_compile_s: NotRequired[float]
    """The compile time of a fresh process with the artifacts loaded."""
    saved_s: NotRequired[float]
    shared_wall_s: NotRequired[float | None]
    """Its compile's wall where it shared the machine (beside the verdicts): ``warm_compile_s`` is then a lone
    run's, priced from its CPU seconds as the cold one's was (``study/records/lone_compile.py``)."""
    loaded: NotRequired[Artifacts | None]
    """What loading the artifacts did."""
    trial_dir: NotRequired[str | None]
    reason: NotRequired[str | None]


def warm_line(warm: WarmStart | None) -> str:
    if not warm:
        return "Warm start: no compile artifacts (an eager winner, or a backend that keeps none)."
    if warm["status"] != "ok":
        return f"Warm start: {warm['artifacts']} kept; measuring it failed ({warm.get('reason')})."
    shared = warm.get("shared_wall_s")
    how = f", beside other processes: priced as alone, its wall {shared:.1f} s" if shared else ""
    return (f"Warm start: compile {warm['warm_compile_s']:.1f} s instead of {warm['cold_compile_s']:.1f} s "
            f"(saves {warm['saved_s']:.1f} s, measured in a fresh process with {warm['artifacts']} loaded{how}; "
            "best_config.py loads it)")
