"""The estimate per phase against a finished study's wall per phase (issue 49): the study's storage is read, its
state before the search is rebuilt (its numerics reference and its queued baselines, nothing measured) and priced by
today's :func:`autocompile.study.estimate.estimate`; so is its state as each phase started (the search's trials,
then the confirmation's too). A change of the estimate is judged against a real study without running it again.

    python benchmarks/recipes/estimate_vs_wall.py RUN_DIR +model=gpt2-tiny [the study's other overrides]

``RUN_DIR``: the study's run directory (``<output_root>/<study name>``, holding ``summary.json`` and the journal).
``tests/test_estimate.py`` holds the committed default study's rows to +-25 %.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
from hydra import compose, initialize_config_dir

from autocompile.config.commands import CONF_DIR, available_models
from autocompile.config.settings import Settings, register, settings_from
from autocompile.config.space import SearchSpace
from autocompile.study.estimate import StudyEstimate, compile_prior_s, estimate
from autocompile.study.records.compile_prior import PRIOR_KEY
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import IN_FLIGHT, REFERENCE, storage_for
from autocompile.study.reuse import REUSED, reverifies, reverifying
from autocompile.study.search.baselines import queue_baselines

MOMENTS = {"before the search": (), "as the confirmation starts": ("search",),
           "as the verdicts start": ("search", "confirm")}
"""When the estimate is made -> the phases whose trials the study holds then."""


def rebuilt(finished: optuna.Study, space: SearchSpace, settings: Settings, phases: tuple[str, ...]) -> optuna.Study:
    """``finished`` as it stood once ``phases`` had run: its reference, compile prior and those trials (before the
    search: its queued baselines)."""
    then = optuna.create_study(directions=finished.directions)
    for key in (REFERENCE, PRIOR_KEY, REUSED, IN_FLIGHT, *(f"method.{p}" for p in phases if p != "search")):
        if key in finished.user_attrs:
            then.set_user_attr(key, finished.user_attrs[key])
    if phases:
        then.add_trials([t for t in finished.trials if t.user_attrs.get("phase") in phases])
    elif reverifies(finished):  # what it re-verified, queued as start_from queued it
        for t in finished.trials:
            if t.user_attrs.get("phase") == "search":
                then.enqueue_trial(t.params, user_attrs={k: t.user_attrs[k] for k in ("baseline",)
                                                         if t.user_attrs.get(k)})
    elif settings.study.baselines:
        queue_baselines(then, space)
    return then


def rows(run_dir: Path, settings: Settings) -> list[tuple[str, str, float, float | None]]:
    """(when, phase, estimate s, wall s) for every phase the estimate prices at each moment of :data:`MOMENTS`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    finished = optuna.load_study(study_name=settings.study.name, storage=storage_for("", run_dir))
    if reverifies(finished):  # an exact answer re-verified: its settings as start_from set them
        settings = reverifying(settings, finished.user_attrs[REUSED]["queued"])
    space = SearchSpace(settings.env, settings.fixed_knobs, settings.study.extended, settings.lead_knobs)
    objective = Objective(settings.objective)
    walls = json.loads((run_dir / "summary.json").read_text()).get("phases_wall_s") or {}
    found = []
    for when, phases in MOMENTS.items():
        at: StudyEstimate | None = estimate(rebuilt(finished, space, settings, phases), space, objective, settings,
                                            compile_prior_s(settings))
        assert at is not None, "the study has no numerics reference"
        priced = {"search": at.search_s, "confirm": at.confirm_s, "verdict": at.verdict_s}
        found += [(when, phase, priced[phase], walls.get(phase)) for phase in priced if phase not in phases]
    return found


def main(run_dir: Path, overrides: list[str]) -> None:
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        settings = settings_from(compose("config", overrides=[*overrides, f"output_root={run_dir.parent}"]),
                                 available_models())
    print(f"{run_dir}: today's estimate against the study's wall, per phase")
    print("| made | phase | estimate s | wall s | ratio |\n|---|---|---|---|---|")
    for when, phase, est, wall in rows(run_dir, settings):
        print(f"| {when} | {phase} | {est:.0f} | {'-' if wall is None else round(wall)} | "
              f"{f'x{est / wall:.2f}' if wall else '-'} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
