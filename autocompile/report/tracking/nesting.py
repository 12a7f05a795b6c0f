"""Where a trial's MLflow run sits: the study's parent run has one child per configuration.

A study runs one configuration many times (a duplicate, a retry, a near-miss measured again, the repeats of
the confirmation and verdicts, side-by-side candidates); one flat child per trial made a 4-trial study ~95
rows. So the parent's direct children are its distinct configurations (a trial's ``identity``): the run of the
first trial of each (normally its search trial), and every other trial of that identity nests under that run
(MLflow nests runs at any depth by the ``mlflow.parentRunId`` tag). A trial with no identity (it failed before
its configuration was recorded) stays a direct child.

A nested run's parent is not the study's, so the study's runs are found by its tag, then kept when they hang
under its parent at any depth: another parent with the same study name is another study.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial

from autocompile.report.tracking.child_run import STUDY_TAG
from autocompile.study.records.record import TrialRecord

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"


def tagged_runs(client: MlflowClient, experiment_id: str, study_name: str) -> Iterator[Run]:
    """Every run with the study's tag in the experiment, deleted ones too: a nested run whose configuration
    run was deleted (a second run of one trial) still hangs under the study through it."""
    from mlflow.entities import ViewType

    token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{STUDY_TAG}` = '{study_name}'", run_view_type=ViewType.ALL,
                                  max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def tree(client: MlflowClient, experiment_id: str, study_name: str, parent_id: str) -> list[Run]:
    """The study's active runs under ``parent_id``: its direct children and the runs nested under them."""
    runs = list(tagged_runs(client, experiment_id, study_name))
    up = {r.info.run_id: r.data.tags.get(PARENT_TAG, "") for r in runs}
    return [r for r in runs if r.info.lifecycle_stage == "active" and hangs_under(r.info.run_id, up, parent_id)]


def hangs_under(run_id: str, up: Mapping[str, str], parent_id: str) -> bool:
    """Whether the chain of parents from ``run_id`` reaches ``parent_id`` (at any depth: a move cut off halfway
    leaves a run one level deeper until the next regroup)."""
    seen = {run_id}
    while (run_id := up.get(run_id, "")) and run_id not in seen:
        if run_id == parent_id:
            return True
        seen.add(run_id)
    return False


def identities(trials: Iterable[FrozenTrial]) -> dict[int, str | None]:
    """Trial number -> its configuration's identity (None until its configuration was recorded)."""
    return {t.number: TrialRecord.of(t).identity for t in trials}


def placement(identity_of: Mapping[int, str | None], runs: Mapping[int, str], parent_id: str) -> dict[int, str]:
    """Trial number -> the run its run belongs under: the study's parent for the first trial (by number) of each
    identity with a run, and for a trial without an identity; that first trial's run for the others."""
    heads: dict[str, str] = {}
    out: dict[int, str] = {}
    for number in sorted(runs):
        identity = identity_of.get(number)
        head = heads.setdefault(identity, runs[number]) if identity else runs[number]
        out[number] = parent_id if head == runs[number] else head
    return out


def parent_for(trial: FrozenTrial, identity_of: Mapping[int, str | None], runs: Mapping[int, str],
               parent_id: str) -> str:
    """The run a trial about to be logged goes under: its configuration's run when an earlier trial of its
    identity has one, else the study's parent (it becomes its configuration's run)."""
    return placement(identity_of, {**runs, trial.number: ""}, parent_id)[trial.number]


def regroup(client: MlflowClient, identity_of: Mapping[int, str | None], runs: Mapping[int, str],
            placed: dict[int, str], parent_id: str) -> int:
    """Move each run under the run :func:`placement` says (``placed``: where each hangs now, kept up to date);
    a trial logged before its configuration's first trial (by another tuner, or flat by an older version) moves
    under it. Returns how many moved."""
    moved = 0
    for number, parent in placement(identity_of, runs, parent_id).items():
        if placed.get(number) != parent:
            client.set_tag(runs[number], PARENT_TAG, parent)
            placed[number] = parent
            moved += 1
    if moved:
        log.info("MLflow: %d runs moved under their configuration's run", moved)
    return moved
