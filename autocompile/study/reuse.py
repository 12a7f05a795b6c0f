"""A study that starts from an answer already measured (``study.reuse``, issue 52): used, never trusted blindly.

An exact answer (the same job on the same kind of machine and versions, :func:`answers.answer_key`) is re-verified:
its recommendation, the rivals its race could not rule out (tied, undetermined) and the baselines it must beat
(eager, default ``torch.compile(model)``) are measured once each, briefly, and raced side by side in the fewest
processes a decision needs; no other search, no verdicts, no warm start. The known winner stays the recommendation
unless a candidate beats it beyond the noise today (the race's incumbent). Rivals its own study ruled out are not
raced again (a full study races them). The report says what was reused and from when, and what the race found
today. A related answer (the same model and device, another batch size, world size or version) orders the search
and lends its priors: its ranking's first configurations are measured first, its measured compile spread and
process noise stand in for the class priors until this study measures its own, and the study runs in full.
``study.reuse=off`` ignores both.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import optuna

from autocompile.config.compare_settings import MIN_PROCESSES
from autocompile.config.gpus import device_name
from autocompile.config.knobs import KnobError, TrialConfig
from autocompile.config.settings import Settings
from autocompile.config.space import BASELINES, CONFIRMED_BASELINES, SearchSpace, identity
from autocompile.study.answers import Answer, AnswerKey, differences, find_in_store, numerics_key, read_file
from autocompile.study.phases.confirmation import INCUMBENT
from autocompile.study.phases.racing import NOISE_PRIOR
from autocompile.study.records.compile_prior import MAX_LEARNED_DF, PRIOR_KEY, study_prior, with_learned
from autocompile.study.records.optuna_store import REFERENCE
from autocompile.study.records.record import user_attrs

log = logging.getLogger(__name__)

REUSED = "reused_answer"
"""Study attribute: the answer a study started from (``source``, ``study``, ``finished``, ``exact``, ``differs``,
``queued``), so a resumed study re-verifies the same way and the report says so."""
RELATED_FIRST = 3
"""A related answer's ranking: how many of its best configurations the search measures first."""


def reverifies(study: optuna.Study) -> bool:
    """Whether ``study`` re-verifies an exact answer: its search trials are brief (compile time, program, peak memory;
    one timed window), as the confirmation side by side times their steps."""
    return bool((study.user_attrs.get(REUSED) or {}).get("exact"))


def look_up(settings: Settings, key: AnswerKey) -> Answer | None:
    """The answer ``study.reuse_from`` names, else the newest the tracking store holds for ``key``."""
    s = settings.study
    if s.reuse == "off":
        return None
    if s.reuse_from:
        return read_file(Path(s.reuse_from))
    return find_in_store(settings.tracking_uri, key) if settings.tracking.enabled else None


def reverifying(settings: Settings, queued: int) -> Settings:
    """The settings of a study re-verifying an exact answer: its ``queued`` configurations only, all of them raced
    in the confirmation side by side in :data:`MIN_PROCESSES` processes (unless more were asked), nothing else."""
    study = dataclasses.replace(settings.study, n_trials=queued, confirm_top=queued, verdicts="none",
                                warm_start=False, remeasure_pruned=0, prune=False, baselines=False)
    compare = dataclasses.replace(settings.compare, processes=MIN_PROCESSES)
    return dataclasses.replace(settings, study=study, compare=compare)


def known_answer(study: optuna.Study, settings: Settings, key: AnswerKey) -> Answer | None:
    """The answer a new study starts from (:func:`look_up`); None for a study that already started (resumed)."""
    if study.user_attrs.get(REUSED) is not None or study.trials:
        return None
    return look_up(settings, key)


def reference_from(study: optuna.Study, answer: Answer | None, key: AnswerKey, settings: Settings) -> bool:
    """Take an exact answer's numerics reference as the study's where what eager's losses depend on matches too
    (:attr:`Answer.numerics_key`; the re-verified eager baseline is checked against it all the same). False where
    there is none to take."""
    if answer is None or answer.key != key.exact or study.user_attrs.get(REUSED) is not None \
            or answer.numerics_key != numerics_key(settings):
        return False
    ref = answer.reference
    if ref.get("status") != "ok" or not ref.get("losses"):
        return False
    where = ref.get("reused_from") or f"study {answer.study} ({answer.finished}, {answer.source})"  # where it ran
    study.set_user_attr(REFERENCE, {**ref, "reused_from": where})
    log.info("numerics reference: eager's losses as %s measured them (the same identity), not run again", where)
    return True


def start_from(study: optuna.Study, space: SearchSpace, settings: Settings, key: AnswerKey,
               answer: Answer | None) -> Settings:
    """Queue what a known answer (:func:`known_answer`) says to measure first, and return the settings the study runs
    with (the given ones unless it re-verifies an exact answer). A study that already has trials keeps the way it
    started."""
    kept: dict[str, Any] | None = study.user_attrs.get(REUSED)
    if kept is not None:
        return reverifying(settings, kept["queued"]) if kept["exact"] else settings
    if answer is None:
        return settings
    exact = answer.key == key.exact
    queued = enqueue(study, space, [answer.winner, *answer.contenders] if exact else answer.ranking[:RELATED_FIRST],
                     [name for name in CONFIRMED_BASELINES if name in BASELINES] if exact else [])
    if not queued:
        return settings
    differs = differences(answer, key)
    priors = [] if exact else adopt_priors(study, answer, settings)
    study.set_user_attr(REUSED, {"source": answer.source, "study": answer.study, "finished": answer.finished,
                                 "winner": answer.winner_name, "exact": exact, "differs": differs,
                                 "contenders": len(answer.contenders) if exact else 0,
                                 "queued": queued, "decided": answer.decided, "priors": priors})
    if exact and (winner := config_of(space, answer.winner)) is not None:
        study.set_user_attr(INCUMBENT, identity(winner, space.env))  # kept unless beaten beyond the noise
    if exact:
        log.info("reusing the answer of study %s (%s, %s): %s; re-verifying it against eager and default compile "
                 "side by side (study.reuse=off runs the full study)", answer.study, answer.finished, answer.source,
                 answer.winner_name)
        return reverifying(settings, queued)
    why = ", ".join(differs)
    log.info("a related answer (study %s, %s; differs in %s): its %d best configurations are measured first%s",
             answer.study, answer.source, why, queued, f"; priors from it: {'; '.join(priors)}" if priors else "")
    return settings


def adopt_priors(study: optuna.Study, answer: Answer, settings: Settings) -> list[str]:
    """A related answer's measurements of this machine's noise as the study's priors (the same device only): its
    compile spread pooled into the study's compile prior (at most ``MAX_LEARNED_DF`` df; not over
    ``objective.compile_cv``), its alone processes' noise until the study measures its own. Returns what was
    taken, in words."""
    p = answer.priors
    if not p or p.get("device") != device_name(settings.device):
        return []
    taken = []
    if p.get("compile_cv") is not None and float(p.get("compile_df") or 0) >= 1 and \
            settings.objective.compile_cv is None:
        found = [(float(p["compile_cv"]), min(float(p["compile_df"]), MAX_LEARNED_DF))]
        pooled = with_learned(study_prior(study, settings.objective), found, f"related study {answer.study}")
        study.set_user_attr(PRIOR_KEY, pooled.as_dict())
        taken.append(f"compile spread {pooled.cv:.1%} on {pooled.df:g} df")
    if p.get("alone_noise") is not None:
        study.set_user_attr(NOISE_PRIOR, {"rel_sd": float(p["alone_noise"]), "df": p.get("alone_df"),
                                          "source": f"related study {answer.study} ({answer.source})"})
        taken.append(f"process noise {float(p['alone_noise']):.1%}")
    return taken


def config_of(space: SearchSpace, flat: dict[str, Any]) -> TrialConfig | None:
    """A recorded configuration as this study's space builds it; None (logged) where it is not valid here."""
    try:
        return TrialConfig.from_flat({**space.start(), **flat, **space.fixed}, space.env, strict=False)
    except KnobError as exc:
        log.info("a reused configuration is not valid here (%s): skipped", exc)
        return None


def enqueue(study: optuna.Study, space: SearchSpace, configs: list[dict[str, Any]], baselines: list[str]) -> int:
    """Queue each distinct valid configuration of ``configs``, then the ``baselines`` not among them, as search
    trials; returns how many. A configuration that is a baseline is queued as that baseline (the report's speedups
    and the confirmation's race know it by that name)."""
    named = space.baseline_identities()
    seen: set[str | None] = set()
    for flat in configs:
        if (config := config_of(space, flat)) is None:
            continue
        if (ident := identity(config, space.env)) not in seen:
            seen.add(ident)
            attrs = user_attrs(baseline=named[ident]) if ident in named else None
            study.enqueue_trial(space.params(config.flat()), user_attrs=attrs)
    for name in baselines:
        try:
            params = space.baseline_params(name)
        except KnobError as exc:
            log.info("baseline %s skipped: %s", name, exc)
            continue
        ident = next((i for i, n in named.items() if n == name), None)
        if ident not in seen:
            seen.add(ident)
            study.enqueue_trial(params, user_attrs=user_attrs(baseline=name))
    return len(seen)
