"""The prior of the cold-compile spread that every time-to-train interval carries: per device class, learned from
what this machine measured before.

A study measures the spread of one cold compile only where it compiled a program cold more than once: 1-3 degrees
of freedom, which alone leave intervals of +-40 % (:func:`autocompile.study.statistics.intervals.pooled_spread`).
So it is pooled with a prior, weighted by the prior's df. The prior is the device class's
(:data:`CLASS_PRIORS`), pooled in turn with the spreads that earlier studies under the same ``output_root``
measured on the same device (their ``summary.json``), and set aside once those weigh as much as it: a machine whose
compiles spread wider than the class says teaches its next study so. The prior is fixed when a study is created
(user attribute :data:`PRIOR_KEY`), so a resumed study, its report and MLflow read the same intervals.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.gpus import device_name
from autocompile.config.sections import ObjectiveSettings
from autocompile.config.settings import Settings
from autocompile.study.statistics.intervals import CompileSpread

log = logging.getLogger(__name__)

PRIOR_KEY = "compile_prior"
"""The study's user attribute holding its prior (:meth:`CompileSpread.as_dict`)."""

CLASS_PRIORS: dict[str, tuple[float, float, str]] = {
    "cpu": (0.10, 8, "13 committed studies on the 2-core VM measured 2.7-16.3 %, pooled 9.9 % on 40 df; counted as 8 "
                     "since models differ: benchmarks/results/cpu-2core/issue50/compile_prior.md"),
    "cuda": (0.10, 2, "one H200 compiled the GPT-2 train step cold in 52.2 and 62.9 s (13 % on 1 df, "
                      "benchmarks/results/h200/); the CPU's 10 % on few df until more is measured"),
}
"""Per device class: relative sd of one cold compile, the df it counts as, and where it comes from."""

MAX_LEARNED_DF = 12
"""At most this many df come from earlier studies: a prior never outweighs a study's own dozen cold compiles."""


def class_prior(device: str, settings: ObjectiveSettings) -> CompileSpread:
    """``objective.compile_cv`` / ``compile_df`` where given, else the device class's (:data:`CLASS_PRIORS`)."""
    cv, df, why = CLASS_PRIORS["cuda" if device.startswith("cuda") else "cpu"]
    if settings.compile_cv is not None:
        cv, why = settings.compile_cv, "objective.compile_cv"
    if settings.compile_df is not None:
        df = settings.compile_df
    return CompileSpread(cv, df, f"prior {cv:.1%} on {df:g} df ({why})")


def learned_prior(base: CompileSpread, output_root: Path, device_name: str, run_dir: Path | None = None
                  ) -> CompileSpread:
    """``base`` pooled with the spreads earlier studies under ``output_root`` measured on ``device_name`` (their
    ``summary.json``, this study's own ``run_dir`` left out; a file that cannot be read is skipped), at most
    :data:`MAX_LEARNED_DF` df of them, the newest first; once they count as many df as ``base``, they alone."""
    found: list[tuple[float, float]] = []
    paths = sorted([*output_root.glob("*/summary.json"), *output_root.glob("*/*/summary.json")],
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for path in paths:
        if run_dir is not None and path.parent.resolve() == run_dir.resolve():
            continue
        spread = _measured(path, device_name)
        if spread is not None:
            cv, df = spread
            take = min(df, MAX_LEARNED_DF - sum(d for _, d in found))
            if take >= 1:
                found.append((cv, take))
    studies = f"{len(found)} earlier stud{'y' if len(found) == 1 else 'ies'} on this device"
    return with_learned(replace(base, device=device_name), found, studies) if found else base


def with_learned(base: CompileSpread, found: list[tuple[float, float]], where: str) -> CompileSpread:
    """``base`` pooled with measured spreads (cv, df) from ``where``, weighted by df; once those count as many df
    as ``base``, they alone (a machine's own record outweighs the class's stand-in)."""
    df = sum(d for _, d in found)
    cv = math.sqrt(sum(d * c**2 for c, d in found) / df)
    mine = f"{cv:.1%} on {df:g} df that {where} measured"
    if df >= base.df:
        return CompileSpread(cv, df, f"prior {mine} (the class's {base.cv:.1%} set aside)", device=base.device)
    total = base.df + df
    pooled = math.sqrt((base.df * base.cv**2 + df * cv**2) / total)
    return CompileSpread(pooled, total, f"{base.source}, with {mine}: prior {pooled:.1%} on {total:g} df",
                         device=base.device)


def _measured(path: Path, device_name: str) -> tuple[float, float] | None:
    try:
        spread: Any = (json.loads(path.read_text()).get("confirmed") or {}).get("compile_spread") or {}
        cv, df = spread.get("measured_cv"), float(spread.get("measured_df") or 0)
    except (OSError, ValueError, AttributeError) as exc:
        log.debug("compile prior: %s skipped (%s)", path, exc)
        return None
    if spread.get("device") != device_name or cv is None or df < 1 or not 0 <= float(cv) < 1:
        return None
    return float(cv), df


def record_prior(study: optuna.Study, prior: CompileSpread) -> None:
    """Fix a new study's prior (a resumed one keeps the prior it started with)."""
    if PRIOR_KEY not in study.user_attrs:
        study.set_user_attr(PRIOR_KEY, prior.as_dict())


def study_prior(study: optuna.Study, settings: ObjectiveSettings) -> CompileSpread:
    """The prior the study recorded, else (a study made before priors were recorded) the CPU class's."""
    kept = study.user_attrs.get(PRIOR_KEY)
    if kept:
        return CompileSpread(float(kept["cv"]), float(kept["df"]), str(kept["source"]), device=str(kept["device"]))
    return class_prior("cpu", settings)


def prior_for(settings: Settings, run_dir: Path | None = None) -> CompileSpread:
    """A new study's (or comparison's) prior: the device class's, learned from the earlier studies under
    ``output_root`` on this device unless ``objective.compile_cv`` was given."""
    base = class_prior(settings.device, settings.objective)
    name = device_name(settings.device)
    if settings.objective.compile_cv is not None:
        return CompileSpread(base.cv, base.df, base.source, device=name)
    return learned_prior(CompileSpread(base.cv, base.df, base.source, device=name), Path(settings.output_root), name,
                         run_dir)
