"""A script's candidates timed side by side in one of its processes (``ScriptSpec.rotation``).

The script runs its own loop as always; the meter counts its steps (:class:`~autocompile.trial.script.meter.Meter`)
and, at step edges, switches which candidate's variant of the compiled units runs
(:mod:`autocompile.trial.script.variants`). First each candidate in turn (the build order rotated by the
process's ``shift``) runs its warm-up, and is checked to have compiled the program of its cold run alone
(coverage, fingerprint: ``not_same_program`` otherwise). Then rounds: in each, every candidate, in rotating order
(A B C, B C A, ...), runs ``settle_steps`` untimed steps and one window of ``window_steps`` steps, timed in wall
and CPU seconds, exactly as the model path's side-by-side processes
(:mod:`autocompile.trial.timing.sidebyside_worker`) do, with their stopping rule; a round in which a frame
compiled is dropped for every candidate, and a candidate that compiles in two rounds fails. The result is
that worker's: ``candidates`` in the spec's order with ``step_s_windows``, ``step_cpu_s_windows``,
``fingerprint`` and ``status``, which :func:`autocompile.study.phases.sidebyside.windows` reads.

One process only (a script on several ranks keeps fresh-process rounds). Torch only: this runs inside the
user's processes.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from autocompile.config.script_settings import ScriptRotation, ScriptSpec
from autocompile.config.spec import write_json_atomic
from autocompile.trial.program.graphs import listening
from autocompile.trial.script.ending import CannotTakeOver, ScriptEnded
from autocompile.trial.script.meter import Meter
from autocompile.trial.script.ranks import sync
from autocompile.trial.script.variants import Variants
from autocompile.trial.timing.compile_artifacts import load_artifacts
from autocompile.trial.timing.readings import classify, environment
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.shape_state import load_shape_state
from autocompile.trial.timing.sidebyside_worker import (
    LOSSES_KEPT,
    NotSameProgram,
    rotate,
    rounds_done,
    worst_half_width,
)
from autocompile.trial.timing.stats import descheduled
from autocompile.trial.timing.worker import exit_now

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
        self.step_windows: dict[int, list[float]] = {}
        self.cpu_windows: dict[int, list[float]] = {}
        self.recompiled: dict[int, int] = {}
        self.rounds_timed = 0
        self.timed = 0.0
        self.timing_started = False
        self.members: list[int] = []
        self.position = 0
        self.settle_from: int | None = None
        """The step the active candidate's settling began (None: its window is open)."""
        self.mark: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
        """The open window: wall clock, CPU seconds, frames compiled, step."""
        self.this_round: dict[int, tuple[float, float]] = {}
        self.compiled_now = False
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
        self.timing_started = True
        self.step_windows = {i: [] for i in ok}
        self.cpu_windows = {i: [] for i in ok}
        self.recompiled = dict.fromkeys(ok, 0)
        self.begin_round()

    def check_candidate(self, i: int) -> None:
        """Candidate ``i`` ran the program of its cold run alone, or it fails here (the others go on)."""
        if (unmet := self.agent.unmet()) is not None:  # prepare() is the process's: every candidate's problem
            raise CannotTakeOver(unmet)
        label = self.rotation.labels[i]
        try:
            program = self.variants.program(i, self.models, self.trained_weights(), len(self.agent.calls),
                                            self.agent.prepared_knobs())
            expected = self.rotation.expected[i]
            if expected and program["fingerprint"] != expected:
                raise NotSameProgram(f"compiled program {program['fingerprint']} beside the other candidates, "
                                     f"{expected} in its own process: it cannot share a process with them")
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
            self.own_losses[self.active].append(torch.stack([t.float().reshape(()) for t in self.pending]).sum())
            self.pending = []
        self.advance()

    def begin_round(self) -> None:
        ok = [i for i in sorted(self.step_windows) if self.outcome[i].ok]
        self.members = rotate(ok, self.rounds_timed + self.rotation.shift)
        self.position, self.this_round, self.compiled_now = 0, {}, False
        self.enter(self.members[0])

    def enter(self, i: int) -> None:
        self.switch_to(i)
        self.settle_from = self.steps
        if not self.rotation.settle_steps:
            self.open_mark()

    def open_mark(self) -> None:
        self.settle_from = None
        sync()
        self.mark = (time.perf_counter(), time.process_time(), self.frames(), self.steps)

    def advance(self) -> None:
        """After each step of a round: settle, time the window, go on to the next candidate or round."""
        if self.settle_from is not None:
            if self.steps - self.settle_from >= self.rotation.settle_steps:
                self.open_mark()
            return
        clock, cpu, frames, start = self.mark
        n = self.rotation.window_steps
        if self.steps - start < n:
            return
        sync()
        seconds, cpu_s = time.perf_counter() - clock, time.process_time() - cpu
        i = self.members[self.position]
        if self.frames() != frames:
            self.compiled_now = True
            self.recompiled[i] += 1
        self.this_round[i] = (seconds / n, cpu_s / n)
        self.position += 1
        if self.position < len(self.members):
            self.enter(self.members[self.position])
        else:
            self.end_round()

    def end_round(self) -> None:
        n = self.rotation.window_steps
        self.timed += sum(s for s, _ in self.this_round.values()) * n
        if self.compiled_now:  # rounds stay aligned: dropped for every candidate
            log.warning("frames compiled in round %d: dropped", self.rounds_timed)
        else:
            for i, (step_s, cpu_s) in self.this_round.items():
                self.step_windows[i].append(step_s)
                self.cpu_windows[i].append(cpu_s)
        for i, count in self.recompiled.items():
            if count > 1 and self.outcome[i].ok:
                self.outcome[i] = TrialResult(status="failed", label=self.outcome[i].label,
                                              failure="compile_in_timed_part",
                                              reason="frames compiled while timing, in two rounds: no steady state")
        self.progress("round", round=self.rounds_timed,
                      step_s={self.rotation.labels[i]: s for i, (s, _) in self.this_round.items()})
        self.rounds_timed += 1
        if self.more_rounds():
            self.begin_round()
        else:
            self.finish()

    def ok_windows(self) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
        ok = [i for i in self.step_windows if self.outcome[i].ok]
        return {i: self.step_windows[i] for i in ok}, {i: self.cpu_windows[i] for i in ok}

    def more_rounds(self) -> bool:
        """The model path's stopping rule (``SideBySide.more_rounds``): the minimum of rounds, then until every
        candidate's interval against the fastest is within ``precision`` or ``max_timed_s`` is spent."""
        r = self.rotation
        windows, cpu = self.ok_windows()
        if len(windows) < 2:
            return False
        if rounds_done(windows) < r.min_rounds:
            return self.timed < r.max_timed_s * 3  # dropped rounds may delay the minimum; never forever
        if self.timed >= r.max_timed_s:
            return False
        return worst_half_width(list(windows.values()), [cpu[i] for i in windows]) > r.precision

    # -- the end -------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        self.finished = True
        self.timeline["timed_done"] = time.time()
        if self.rank == 0:
            write_json_atomic(self.trial_dir / "result.json", self.side_by_side_result().to_json())
        logging.shutdown()
        exit_now(0)

    def side_by_side_result(self) -> TrialResult:
        """``result.json`` in the side-by-side worker's shape."""
        windows, cpu = self.ok_windows()
        candidates = []
        for i, label in enumerate(self.rotation.labels):
            outcome = self.outcome.get(i) or TrialResult(
                status="failed", label=label, failure="script_ended",
                reason="the script ended before this candidate warmed up")
            if i in windows:
                out = descheduled(windows[i], cpu[i])
                kept = [s for k, s in enumerate(windows[i]) if k not in out]
                losses = self.own_losses[i][:LOSSES_KEPT]
                outcome.step_s_windows, outcome.step_cpu_s_windows = windows[i], cpu[i]
                outcome.step_s = math.exp(statistics.fmean(math.log(s) for s in kept)) if kept else None
                outcome.stalled_windows = len(windows[i]) - len(kept)
                outcome.losses = [float(x) for x in torch.stack(losses).float().tolist()] if losses else None
            candidates.append(outcome)
        return TrialResult(
            candidates=candidates, order=self.order, rounds=max((len(w) for w in windows.values()), default=0),
            window_steps=self.rotation.window_steps,
            throughput_unit=self.unit or ("backward() calls" if self.step_kind == "backward" else "optimizer steps"),
            script={"path": self.spec.script.path, "args": self.spec.script.args, "steps": self.steps,
                    "step": self.step_kind, "compile_calls": self.agent.calls},
            timeline=self.timeline, environment=environment(self.device(), self.rank, torch.get_num_threads()))

    def at_exit(self) -> None:
        """The script ended first: the rounds so far are the measurement once every candidate has two."""
        if self.finished:
            return
        windows, _ = self.ok_windows()
        if self.timing_started and len(windows) >= 2 and rounds_done(windows) >= 2:
            self.finish()
        self.fail(ScriptEnded(self.why_ended()))

    def why_ended(self) -> str:
        if not self.timing_started:
            return super().why_ended() if not self.steps else (
                f"the script stopped after {self.steps} steps, while candidate {self.warming + 1} of "
                f"{len(self.order)} warmed up: side by side, every candidate warms up in turn; raise its step "
                "budget (script.args)")
        r = self.rotation
        needed = len(self.order) * (r.settle_steps + r.window_steps) * 2
        return (f"the script stopped after {self.steps} steps, before two rounds of windows (about {needed} more "
                "steps after the warm-ups): raise its step budget (script.args)")
