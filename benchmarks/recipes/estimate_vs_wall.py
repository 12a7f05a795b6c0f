"""The estimate before the search, per phase, against a finished study's wall per phase (issue 49): the study's
storage is read, the state before its search is rebuilt (its numerics reference and its queued baselines, nothing
measured) and priced by today's :func:`autocompile.study.estimate.estimate`, so a change of the estimate is judged
against a real study without running it again. Also prints what the study itself estimated as each phase started.

    python benchmarks/recipes/estimate_vs_wall.py RUN_DIR +model=gpt2-tiny [the study's other overrides]

``RUN_DIR``: the study's run directory (``<output_root>/<study name>``, holding ``summary.json`` and the journal).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
from hydra import compose, initialize_config_dir

from autocompile.config.commands import CONF_DIR, available_models
from autocompile.config.settings import register, settings_from
from autocompile.config.space import SearchSpace
from autocompile.study.estimate import compile_prior_s, estimate
from autocompile.study.records.compile_prior import PRIOR_KEY
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import REFERENCE, storage_for
from autocompile.study.search.baselines import queue_baselines


def main(run_dir: Path, overrides: list[str]) -> None:
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        settings = settings_from(compose("config", overrides=[*overrides, f"output_root={run_dir.parent}"]),
                                 available_models())
    finished = optuna.load_study(study_name=settings.study.name, storage=storage_for("", run_dir))
    space = SearchSpace(settings.env, settings.fixed_knobs, settings.study.extended, settings.lead_knobs)
    objective = Objective(settings.objective)
    before = optuna.create_study(directions=objective.directions)
    for key in (REFERENCE, PRIOR_KEY):
        if key in finished.user_attrs:
            before.set_user_attr(key, finished.user_attrs[key])
    if settings.study.baselines:
        queue_baselines(before, space)
    found = estimate(before, space, objective, settings, compile_prior_s(settings))
    assert found is not None, "the study has no numerics reference"
    summary = json.loads((run_dir / "summary.json").read_text())
    walls = summary.get("phases_wall_s") or {}
    kept = summary.get("phases_expected_s") or {}
    print(f"{run_dir}: estimate before the search (today's code) against the study's wall, per phase")
    print("| phase | estimate s | wall s | ratio | the study's own estimate as the phase started |")
    print("|---|---|---|---|---|")
    for phase, est in (("search", found.search_s), ("confirm", found.confirm_s), ("verdict", found.verdict_s)):
        wall = walls.get(phase)
        ratio = f"x{est / wall:.2f}" if wall else "-"
        print(f"| {phase} | {est:.0f} | {wall if wall is None else round(wall)} | {ratio} | {kept.get(phase, '-')} |")
    print(f"basis: {found.costs.basis}; per run eager {found.costs.eager_s:.1f} s, cold {found.costs.cold_s:.1f} s, "
          f"warm {found.costs.warm_s:.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
