"""Several configurations timed side by side in one process (``sidebyside.json``; started as
``python -m autocompile.trial.timing.worker DIR``, the worker of every model-path process).

Two fresh processes of one program differ by 4-20 % on a 2-core VM, while two windows of one
process differ by 2-4 %; comparing candidates across processes carries the first noise twice. Here
every candidate gets its own model built from the same seed (identical weights and batches), its
own configuration applied, and its own warm-up (from its cold trial's compile artifacts where it has
them); each is checked to run exactly its own program (per-unit checks, coverage, and the
fingerprint of its cold trial). Then windows are timed in rotating order (A B C, B C A, C A B, ...):
each round's windows see the same machine, neighbours and drift, so the log-ratio of two
candidates' window step times within a round is paired. The rounds and when they stop are the one scheduler's
(:class:`~autocompile.trial.timing.rounds.Rounds`), timed by :func:`~autocompile.trial.timing.model_rounds.time_rounds`.
The tuner runs a few such processes (rotating the build order too) and puts a random effect per
process into the interval (:mod:`autocompile.study.statistics.intervals`).

What a knob sets for the whole process is scoped to its candidate: ``optimize_ddp`` is patched
around that candidate's build, warm-up and windows. Compile time and peak memory are not measured
here (candidates share the process and a warm cache): they come from each candidate's cold trial.
Torch only, like the trial worker.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import SideBySideSpec
from autocompile.config.torch_private import default_store, dynamo_config
from autocompile.config.window_policy import WindowPolicy
from autocompile.trial.program.build import Built, align, start_process, tensors, warm_up, warmup_steps, window_steps
from autocompile.trial.timing.clock import WindowClock
from autocompile.trial.timing.compile_artifacts import load_artifacts
from autocompile.trial.timing.model_rounds import ModelProcess, time_rounds
from autocompile.trial.timing.readings import classify, environment, loss_values, same_program
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.rounds import LOSSES_KEPT, Rounds, rotate, set_side_timing
from autocompile.trial.timing.shape_state import forget_propagated_dims, fresh_shape_state
from autocompile.trial.timing.turn import end_turn, wait_turn

log = logging.getLogger("autocompile.trial.timing.sidebyside_worker")


AGREE_S = 120.0
"""How long a rank waits for the others to report a candidate's status (``AUTOCOMPILE_AGREE_S``): ranks that
failed alike arrive within seconds of each other; one still missing is stuck in a collective."""


class RanksOutOfStep(RuntimeError):
    """A candidate failed on some ranks inside a step; the others wait in its collectives."""


class SideBySide(ModelProcess):
    """Several configurations: each built and warmed up in turn, then timed in the rounds of the one scheduler."""

    def __init__(self, spec: SideBySideSpec, out_dir: Path, rank: int, started: float) -> None:
        super().__init__(out_dir, rank, spec.device, {"worker_start": started})
        self.spec = spec
        self.agreements = 0

    @contextmanager
    def scoped(self, built: Built) -> Iterator[None]:
        """The process-global settings this candidate's configuration needs, for its calls only."""
        with dynamo_config().patch(**built.step.settings):
            yield

    def run(self) -> TrialResult:
        spec = self.spec
        first = spec.candidates[0]
        self.device = start_process(spec.threads, self.device, self.world_size, first.workload.float32_matmul_precision,
                                    programs=len(spec.candidates))
        env = Env.detect(self.device.type, self.world_size, first.workload.shapes_vary)
        outcome: dict[int, TrialResult] = {}
        alive: dict[int, Built] = {}
        order = rotate(list(range(len(spec.candidates))), spec.shift)
        for i in order:  # built and warmed up one after the other: each compile is attributed to its candidate
            label = spec.labels[i]
            self.progress("candidate_start", candidate=i, label=label)
            try:
                alive[i] = self.prepare(i, env)
                program = alive[i].program
                outcome[i] = TrialResult(label=label, fingerprint=program["fingerprint"],
                                         compiled_coverage=program["coverage"], compiled=alive[i].step.compiled,
                                         warm_s=alive[i].warm_s)
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is data; the others go on
                outcome[i] = TrialResult(status="failed", label=label, **classify(exc))
                log.warning("candidate %s: %s", label, outcome[i].reason)
            self.agree(outcome, [i])
            self.progress("candidate_ready", candidate=i, label=label, status=outcome[i].status)
        self.timeline["warmup_done"] = time.time()
        wait_turn(self.out_dir, self.rank, self.progress)  # the device alone from here: other trials paused
        align(self.world_size)
        rounds = Rounds([i for i in sorted(alive) if outcome[i].ok], self.policy, spec.shift, side_by_side=True)
        failed = time_rounds(rounds, alive, WindowClock(self.device, self.sync), self.progress, spec.labels,
                             self.scoped)
        self.timeline["timed_done"] = time.time()
        end_turn(self.rank, self.progress)
        for i, why in failed.items():
            outcome[i] = TrialResult(status="failed", label=outcome[i].label, failure="compile_in_timed_part",
                                     reason=why)
        self.agree(outcome, sorted(rounds.of))  # every rank fails alike (each recorded the ranks' largest values)
        for i in [i for i in rounds.live if outcome[i].ok]:
            set_side_timing(outcome[i], rounds.of[i])
            outcome[i].losses = loss_values(alive[i].losses[:LOSSES_KEPT])
        from autocompile.workload.data import item_unit

        inputs, _ = next(iter(alive.values())).batch(0) if alive else (None, None)
        return TrialResult(
            candidates=[outcome[i] for i in range(len(spec.candidates))], order=order,
            rounds=rounds.kept,
            window_steps=self.policy.window_steps,
            throughput_unit=item_unit(inputs) if inputs is not None else "tokens", timeline=self.timeline,
            environment=environment(self.device, self.rank, spec.threads))

    def prepare(self, i: int, env: Env) -> Built:
        """Build, warm up and check candidate ``i``; raise when it does not run its own program."""
        spec = self.spec
        cand = spec.candidates[i]
        if spec.artifacts[i]:
            load_artifacts(spec.artifacts[i])
        built = self.build(cand, TrialConfig.from_flat(cand.knobs, env))
        fresh_shape_state()
        forget_propagated_dims(t for batch in built.staged for t in tensors(batch))
        with self.scoped(built):
            warm_up(built, warmup_steps(cand), self.sync, lambda *a, **k: None)
        same_program(built.program["fingerprint"], spec.expected[i])
        return built

    @property
    def policy(self) -> WindowPolicy:
        """The spec's windows, their steps rounded up to whole optimizer steps and every sequence length."""
        return dataclasses.replace(self.spec.policy, window_steps=window_steps(self.spec.candidates[0],
                                                                               self.spec.policy.window_steps))

    def agree(self, outcome: dict[int, TrialResult], candidates: list[int]) -> None:
        """A candidate that failed on any rank fails on every rank, with that rank's reason: ranks that went on
        with different candidates would wait in each other's collectives until NCCL's timeout.

        Through the rendezvous store, not a collective: a rank that failed in the middle of a step left the
        others inside that step's collectives, where a collective of this check would pair with theirs. Such
        ranks never report; past :data:`AGREE_S` this rank fails the process, and torchrun ends the others."""
        if self.world_size == 1 or not candidates:
            return
        from datetime import timedelta

        store = default_store()
        self.agreements += 1
        keys = [f"autocompile/agree{self.agreements}/rank{r}" for r in range(self.world_size)]
        store.set(keys[self.rank], json.dumps({i: outcome[i].to_json() for i in candidates if not outcome[i].ok}))
        try:
            store.wait(keys, timedelta(seconds=float(os.environ.get("AUTOCOMPILE_AGREE_S", AGREE_S))))
        except Exception as exc:  # the store's timeout error type differs across torch versions
            raise RanksOutOfStep(f"not every rank reported candidates {[self.spec.labels[i] for i in candidates]}: "
                                 "another rank is still inside a step that failed here") from exc
        for rank in range(self.world_size):
            for i, failed in json.loads(store.get(keys[rank])).items():
                if outcome[int(i)].ok:
                    outcome[int(i)] = TrialResult.from_json({**failed, "reason": f"on rank {rank}: {failed['reason']}"})
                    log.warning("candidate %s failed on rank %d: %s", self.spec.labels[int(i)], rank, failed["reason"])
