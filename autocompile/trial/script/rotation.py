"""A script's candidates timed side by side in one of its processes (``ScriptSpec.rotation``).

The script runs its own loop as always; the meter counts its steps (:class:`~autocompile.trial.script.meter.Meter`)
and, at step edges, switches which candidate's variant of the compiled units runs
(:mod:`autocompile.trial.script.variants`). First each candidate in turn (the build order rotated by the
process's ``shift``) runs its warm-up, and is checked to have compiled the program of its cold run alone
(coverage, fingerprint: ``not_same_program`` otherwise). Then rounds: in each, every candidate, in rotating order
(A B C, B C A, ...), runs ``settle_steps`` untimed steps and one window of ``window_steps`` steps, timed in wall
and CPU seconds by the one clock, in the rounds of the one scheduler
(:class:`~autocompile.trial.timing.rounds.Rounds`) the model path's side-by-side processes use: a round in which a
frame compiled is dropped for every candidate, a candidate that compiles in too many fails. The result is the
model path's: ``candidates`` in the spec's order with ``step_s_windows``, ``step_cpu_s_windows``,
``fingerprint`` and ``status``, which :func:`autocompile.study.phases.sidebyside.windows` reads.

One process only (a script on several ranks keeps fresh-process rounds). Torch only: this runs inside the
user's processes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from autocompile.config.script_settings import ScriptRotation, ScriptSpec
from autocompile.config.spec import write_json_atomic
from autocompile.trial.program.graphs import listening
from autocompile.trial.script.ending import CannotTakeOver, ScriptEnded
from autocompile.trial.script.meter import Meter, step_loss
from autocompile.trial.script.variants import Variants
from autocompile.trial.script.windows import Windows
from autocompile.trial.timing.compile_artifacts import load_artifacts
from autocompile.trial.timing.ranks import exit_now
from autocompile.trial.timing.readings import classify, environment, loss_values, same_program
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.rounds import LOSSES_KEPT, Rounds, rotate, set_side_timing
from autocompile.trial.timing.shape_state import load_shape_state
from autocompile.trial.timing.turn import end_turn, wait_turn

log = logging.getLogger("autocompile.trial.script")


class RotationMeter(Meter):
    """The meter of a side-by-side process of a script: warm-ups in turn, then windows in rotating order."""

    def __init__(self, spec: ScriptSpec, trial_dir: Path, agent: Any, boot: float) -> None:
        super().__init__(spec, trial_dir, agent, boot)
        assert spec.rotation is not None
        self.rotation: ScriptRotation = spec.rotation
        self.variants: Variants = agent.variants
        self.order = rotate(list(range(len(self.variants.all))), self.rotation.shift)
        self.warming = 0
        """Position in ``order`` of the candidate warming up."""
        self.warm_until: int | None = None
        self.outcome: dict[int, TrialResult] = {}
        self.own_losses: dict[int, list[torch.Tensor]] = {i: [] for i in self.order}
        self.rounds: Rounds | None = None
        """The rounds, once every candidate warmed up (None before; the windows are then side by side)."""
        self._listening = listening(self.variants.all[self.order[0]].log)
        self.switch_to(self.order[0], warm=True)

    @property
    def active(self) -> int:
        return self.variants.active

    def switch_to(self, i: int, warm: bool = False) -> None:
        """Run candidate ``i``'s variants from the next step (``warm``: its warm-up, from its cold run's cache)."""
        if warm:
            if artifacts := self.rotation.artifacts[i]:
                load_artifacts(artifacts)
            # automatic dynamic as in its own process at its first training step (an evaluation before it, run
            # here under another candidate, shaped its graphs there: see shape_state)
            if i != self.order[0]:
                load_shape_state(self.rotation.shape_states[i] if self.rotation.shape_states else None,
                                 self.models)
        self.variants.active = i

    # -- the warm-ups, one candidate after the other -----------------------------------------------------------
    @property
    def timing_started(self) -> bool:
        return self.rounds is not None

    def end_warmup(self) -> None:
        if self.step_kind == "undecided" or self.timing_started:
            return
        if self.warm_until is None:
            self.warm_until = self.warmup_target()
        if self.steps < self.warm_until:
            return
        i = self.order[self.warming]
        self._listening.__exit__(None, None, None)
        self.check_candidate(i)
        self.own_losses[i] += self.losses
        self.losses = []
        self.warming += 1
        if self.warming < len(self.order):
            nxt = self.order[self.warming]
            self._listening = listening(self.variants.all[nxt].log)
            self._listening.__enter__()
            self.switch_to(nxt, warm=True)
            # its compile lets the loader's workers fill their queue again: drained in its warm-up too
            self.warm_until = self.steps + max(2, self.warmup_target())
            self.progress("candidate_start", candidate=nxt, label=self.rotation.labels[nxt])
            return
        self.timeline["warmup_done"] = time.time()
        ok = [i for i in self.order if self.outcome[i].ok]
        if len(ok) < 2:
            self.finish()  # ends the process: the failed candidates say why
            return
        self.rounds = Rounds(ok, self.rotation.policy, self.rotation.shift, side_by_side=True)
        self.windows = Windows(self.rounds, self.switch_to)
        wait_turn(self.trial_dir, self.rank, self.progress)  # the device alone from here: other trials paused
        self.windows.begin_round(self.at())

    def check_candidate(self, i: int) -> None:
        """Candidate ``i`` ran the program of its cold run alone, or it fails here (the others go on)."""
        if (unmet := self.agent.unmet()) is not None:  # prepare() is the process's: every candidate's problem
            raise CannotTakeOver(unmet)
        label = self.rotation.labels[i]
        try:
            program = self.variants.program(i, self.models, self.trained_weights(), len(self.agent.calls),
                                            self.agent.prepared_knobs())
            same_program(program["fingerprint"], self.rotation.expected[i])
            self.outcome[i] = TrialResult(label=label, fingerprint=program["fingerprint"],
                                          compiled_coverage=program["coverage"],
                                          compiled=list(self.variants.all[i].compiled))
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is data; the others go on
            self.outcome[i] = TrialResult(status="failed", label=label, **classify(exc))
            log.warning("candidate %s: %s", label, self.outcome[i].reason)
        self.progress("candidate_ready", candidate=i, label=label, status=self.outcome[i].status,
                      fingerprint=self.outcome[i].fingerprint)

    # -- the rounds ----------------------------------------------------------------------------------------------
    def count_step(self) -> None:
        if not self.timing_started:
            super().count_step()  # the warm-up: its steps and losses as a single candidate's
            return
        self.steps += 1
        if self.pending:
            self.own_losses[self.active].append(step_loss(self.pending))
            self.pending = []
        self.take_windows()

    def round_done(self, failed: list[int]) -> None:
        """Side by side: a candidate that compiled in too many windows fails (the others go on)."""
        assert self.rounds is not None
        this_round = self.windows.this_round
        for i in failed:
            self.outcome[i] = TrialResult(status="failed", label=self.outcome[i].label, failure="compile_in_timed_part",
                                          reason=f"frames compiled while timing, in more than "
                                                 f"{self.rotation.policy.rewarm_windows} windows: no steady state")
        if self.windows.dropped:  # rounds stay aligned: dropped for every candidate
            log.warning("frames compiled in round %d: dropped", self.rounds.started - 1)
        self.progress("round", round=self.rounds.started - 1, step_s={
            self.rotation.labels[i]: w.seconds / self.rotation.policy.window_steps for i, w in this_round.items()})

    # -- the end -------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        self.finished = True
        self.timeline["timed_done"] = time.time()
        end_turn(self.rank, self.progress)
        if self.rank == 0:
            write_json_atomic(self.trial_dir / "result.json", self.side_by_side_result().to_json())
        logging.shutdown()
        exit_now(0)

    def side_by_side_result(self) -> TrialResult:
        """``result.json`` in the model path's side-by-side shape."""
        live = self.rounds.live if self.rounds is not None else []
        candidates = []
        for i, label in enumerate(self.rotation.labels):
            outcome = self.outcome.get(i) or TrialResult(
                status="failed", label=label, failure="script_ended",
                reason="the script ended before this candidate warmed up")
            if self.rounds is not None and i in live:
                set_side_timing(outcome, self.rounds.of[i])
                outcome.losses = loss_values(self.own_losses[i][:LOSSES_KEPT])
            candidates.append(outcome)
        return TrialResult(
            candidates=candidates, order=self.order,
            rounds=self.rounds.kept if self.rounds else 0,
            window_steps=self.rotation.policy.window_steps,
            throughput_unit=self.unit or ("backward() calls" if self.step_kind == "backward" else "optimizer steps"),
            script={"path": self.spec.script.path, "args": self.spec.script.args, "steps": self.steps,
                    "step": self.step_kind, "compile_calls": self.agent.calls},
            timeline=self.timeline, environment=environment(self.device(), self.rank, torch.get_num_threads()))

    def at_exit(self) -> None:
        """The script ended first: the rounds so far are the measurement once every candidate has two."""
        if self.finished:
            return
        if self.rounds is not None and len(self.rounds.live) >= 2 and self.rounds.clean() >= 2:
            self.finish()
        self.fail(ScriptEnded(self.why_ended()))

    def why_ended(self) -> str:
        if not self.timing_started:
            return super().why_ended() if not self.steps else (
                f"the script stopped after {self.steps} steps, while candidate {self.warming + 1} of "
                f"{len(self.order)} warmed up: side by side, every candidate warms up in turn; raise its step "
                "budget (script.args)")
        p = self.rotation.policy
        needed = len(self.order) * (p.settle_steps + p.window_steps) * 2
        return (f"the script stopped after {self.steps} steps, before two rounds of windows (about {needed} more "
                "steps after the warm-ups): raise its step budget (script.args)")
