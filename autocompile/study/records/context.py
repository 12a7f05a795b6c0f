"""What every trial of one study is measured with, as one value: the study, its space, objective and settings,
its run directory and the launcher's agents. The tuner builds it once; the search, the repeats and the side-by-side
processes read it, instead of the same six values passed one by one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace
from autocompile.study.records.objective import Objective
from autocompile.trial.launcher import Agents


@dataclass
class StudyContext:
    """One study's shared values (the space may narrow once, after a script's reference run)."""

    study: optuna.Study
    """The Optuna study every trial is told to."""
    space: SearchSpace
    """The knobs and their values searched, with the workload's environment."""
    objective: Objective
    """What a measurement scores, and its constraints."""
    settings: Settings
    """The study's whole typed configuration."""
    run_dir: Path
    """``<output_root>/<study name>``: trials under ``trials/NNNN``, side-by-side processes under their phase."""
    agents: Agents
    """How the launcher reaches the hosts it starts torchrun on."""
