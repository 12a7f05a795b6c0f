"""What a study's parent run gets at its end, from the report: one point per metric (the counts, the best, the
confirmed winner's gains with their interval, the noise) at the study's trial count, so a resumed study's points show
the best as the study grew; and the tags that name the best and the confirmed configuration."""

from __future__ import annotations

from typing import Any

from autocompile.report.tracking.child_run import ParentTags
from autocompile.report.tracking.plots import study_note

Metric = tuple[str, float, int]


def parent_summary(report: Any, run_ids: dict[int, str], step: int) -> tuple[list[Metric], ParentTags]:
    """The parent run's metrics and tags from ``report`` (``summary.Report``); ``run_ids``: each trial's child run."""
    metrics: list[Metric] = [(f"n_{k}", v, step) for k, v in report.counts.items()
                             if k in ("trials", "complete", "pruned", "failed")]
    tags: ParentTags = {"stop_reason": report.stop_reason, "mlflow.note.content": study_note(report)}
    best = report.best
    if best is not None:
        metrics += [("best_tokens_per_s", best.result.tokens_per_s, step),
                    ("best_compile_s", best.result.compile_s, step),
                    ("best_time_to_train_s", best.time_to_train_s, step)]
        metrics += [(f"best_speedup_vs_{name}", s["step_speedup"], step) for name, s in report.speedups.items()]
        tags.update(best_trial=best.number, best_config=best.name[:5000], best_run_id=run_ids.get(best.number, ""))
    outcome = report.confirmed
    if outcome is not None and (w := outcome.winner) is not None:
        tags.update(confirmed_trial=w.trial, confirmed_config=(w.name or "defaults")[:5000],
                    confirmed_conclusion=outcome.conclusion[:5000])
        if w.step_s_geomean is not None:
            metrics.append(("confirmed_step_s", w.step_s_geomean, step))
        for name, gain in outcome.gains.items():
            if gain.step:
                metrics += [(f"confirmed_step_change_vs_{name}{suffix}", value, step)
                            for value, suffix in ((gain.step.change, ""), (gain.step.low, "_low"),
                                                  (gain.step.high, "_high")) if value is not None]
    if getattr(report, "noise", None):
        metrics.append(("noise_rel_sd", report.noise.rel_sd, step))
    return metrics, tags
