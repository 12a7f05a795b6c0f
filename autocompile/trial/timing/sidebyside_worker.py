"""Several configurations timed side by side in one process:
``python -m autocompile.trial.timing.sidebyside_worker DIR``.

Two fresh processes of one program differ by 4-20 % on a 2-core VM, while two windows of one
process differ by 2-4 %; comparing candidates across processes carries the first noise twice. Here
every candidate gets its own model built from the same seed (identical weights and batches), its
own configuration applied, and its own warm-up (from its cold trial's compile artifacts where it has
them); each is checked to run exactly its own program (per-unit checks, coverage, and the
fingerprint of its cold trial). Then windows are timed in rotating order (A B C, B C A, C A B, ...):
each round's windows see the same machine, neighbours and drift, so the log-ratio of two
candidates' window step times within a round is paired. Timing stops once every candidate's
interval against the fastest reaches ``precision`` inside this process, or at ``max_timed_s``.
The tuner runs a few such processes (rotating the build order too) and puts a random effect per
process into the interval (:mod:`autocompile.study.statistics.intervals`).

What a knob sets for the whole process is scoped to its candidate: ``optimize_ddp`` is patched
around that candidate's build, warm-up and windows. Compile time and peak memory are not measured
here (candidates share the process and a warm cache): they come from each candidate's cold trial.
Torch only, like the trial worker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import SideBySideSpec, write_json_atomic
from autocompile.trial.program.build import (
    Built,
    append_progress,
    build_candidate,
    check_finite,
    period,
    stage,
    start_process,
    synchronize,
    tensors,
    warm_up,
    warmup_steps,
    window_steps,
)
from autocompile.trial.timing.clock import WindowClock
from autocompile.trial.timing.compile_artifacts import load_artifacts
from autocompile.trial.timing.readings import classify, environment, guard_failure_counts, recompile_reasons
from autocompile.trial.timing.recordings import cudagraph_recordings
from autocompile.trial.timing.result import TrialResult
from autocompile.trial.timing.shape_state import forget_propagated_dims, fresh_shape_state
from autocompile.trial.timing.stats import clean_rounds, descheduled, t975
from autocompile.trial.timing.worker import WORKER_START, exit_now

log = logging.getLogger("autocompile.trial.timing.sidebyside_worker")
LOSSES_KEPT = 64
"""Per-step losses kept per candidate (the numerics check reads the first few dozen)."""


AGREE_S = 120.0
"""How long a rank waits for the others to report a candidate's status (``AUTOCOMPILE_AGREE_S``): ranks that
failed alike arrive within seconds of each other; one still missing is stuck in a collective."""


class NotSameProgram(RuntimeError):
    """Beside the others, a candidate compiled another program than in its own process."""


class RanksOutOfStep(RuntimeError):
    """A candidate failed on some ranks inside a step; the others wait in its collectives."""


def rotate(items: list[Any], r: int) -> list[Any]:
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


class SideBySide:
    def __init__(self, spec: SideBySideSpec, out_dir: Path, rank: int) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.rank = rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = torch.device(spec.device)
        self.timeline: dict[str, float] = {"worker_start": WORKER_START}
        self.agreements = 0
        self.staged: dict[str, list[tuple[Any, Any]]] = {}
        """Batches made once per workload (every candidate of a study has the same): :func:`stage`."""

    def progress(self, event: str, **data: Any) -> None:
        if self.rank == 0:
            append_progress(self.out_dir, event, **data)

    def sync(self) -> None:
        synchronize(self.device)

    @contextmanager
    def scoped(self, built: Built) -> Iterator[None]:
        """The process-global settings this candidate's configuration needs, for its calls only."""
        with torch._dynamo.config.patch(**built.step.settings):
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
        windows, cpu = self.time_rounds(alive, outcome)
        self.timeline["timed_done"] = time.time()
        for i, built in alive.items():
            if outcome[i].ok:
                out = descheduled(windows[i], cpu[i])
                kept = [s for k, s in enumerate(windows[i]) if k not in out]
                outcome[i].step_s_windows, outcome[i].step_cpu_s_windows = windows[i], cpu[i]
                outcome[i].step_s = math.exp(statistics.fmean(math.log(s) for s in kept)) if kept else None
                outcome[i].stalled_windows = len(windows[i]) - len(kept)
                outcome[i].losses = [float(x) for x in torch.stack(built.losses[:LOSSES_KEPT]).float().tolist()]
        from autocompile.workload.data import item_unit

        inputs, _ = next(iter(alive.values())).batch(0) if alive else (None, None)
        return TrialResult(
            candidates=[outcome[i] for i in range(len(spec.candidates))], order=order,
            rounds=max((len(w) for w in windows.values()), default=0), window_steps=self.window_steps,
            throughput_unit=item_unit(inputs) if inputs is not None else "tokens", timeline=self.timeline,
            environment=environment(self.device, self.rank, spec.threads))

    def prepare(self, i: int, env: Env) -> Built:
        """Build, warm up and check candidate ``i``; raise when it does not run its own program."""
        spec = self.spec
        cand = spec.candidates[i]
        if spec.artifacts[i]:
            load_artifacts(spec.artifacts[i])
        config = TrialConfig.from_flat(cand.knobs, env)
        built = build_candidate(cand, config, self.device, self.rank, self.world_size)
        key = json.dumps(asdict(cand.workload), sort_keys=True, default=str)
        if key not in self.staged:
            self.staged[key] = stage(built.data, period(cand), self.device)
        built.staged = self.staged[key]
        fresh_shape_state()
        forget_propagated_dims(t for batch in built.staged for t in tensors(batch))
        with self.scoped(built):
            warm_up(built, warmup_steps(cand), self.sync, lambda *a, **k: None)
        expected = spec.expected[i]
        if expected and built.program["fingerprint"] != expected:
            raise NotSameProgram(f"compiled program {built.program['fingerprint']} beside the other candidates, "
                                 f"{expected} in its own process: it cannot share a process with them")
        return built

    @property
    def window_steps(self) -> int:
        return window_steps(self.spec.candidates[0], self.spec.window_steps)

    def time_rounds(self, alive: dict[int, Built], outcome: dict[int, TrialResult]
                    ) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
        """Windows in rotating order until the stopping rule: each candidate's window step seconds, and the
        process CPU seconds per step of each (aligned). A round in which anything compiled is
        dropped for every candidate (rounds stay aligned); a candidate that compiles in two rounds fails
        as ``compile_in_timed_part``. On CUDA the windows' times are read (one synchronisation) only where
        the next decision needs them, every few rounds (:class:`WindowClock`); what failed is agreed there."""
        from torch._dynamo.utils import counters

        spec = self.spec
        n = self.window_steps
        windows: dict[int, list[float]] = {i: [] for i in alive if outcome[i].ok}
        cpu: dict[int, list[float]] = {i: [] for i in windows}
        recompiled: dict[int, int] = dict.fromkeys(windows, 0)
        checked = {i: len(alive[i].losses) for i in windows}
        clock = WindowClock(self.device, self.sync)
        guards = guard_failure_counts()
        timed = 0.0
        r = 0
        while self.more_rounds(windows, cpu, timed):
            rounds: list[tuple[int, dict[int, int], bool]] = []  # (round, candidate -> window index, compiled)
            for _ in range(clock.before_deciding(rounds_done(windows, cpu), spec.min_rounds)):
                members = [i for i in rotate(sorted(windows), r + spec.shift) if outcome[i].ok]
                if len(members) < 2:
                    break
                this_round: dict[int, int] = {}
                compiled_now = False
                for i in members:
                    built = alive[i]
                    with self.scoped(built):
                        built.run(spec.settle_steps)
                        frames = counters["frames"]["total"] + cudagraph_recordings()
                        clock.start()
                        built.run(n)
                        this_round[i] = clock.stop()
                    if counters["frames"]["total"] + cudagraph_recordings() != frames:
                        compiled_now = True
                        recompiled[i] += 1
                rounds.append((r, this_round, compiled_now))
                r += 1
            if not rounds:
                break
            seconds = clock.resolve()
            for i in checked:
                check_finite(alive[i].losses[checked[i]:], alive[i].steps_done)
                checked[i] = len(alive[i].losses)
            for i, count in recompiled.items():
                if count > 1 and outcome[i].ok:
                    failed = "; ".join(recompile_reasons(guards)) or "none (CUDA graphs re-recorded)"
                    outcome[i] = TrialResult(
                        status="failed", label=outcome[i].label, failure="compile_in_timed_part",
                        reason="frames compiled or CUDA graphs recorded while timing, in two rounds: no steady state; "
                               f"failed guards in the process: {failed}")
            self.agree(outcome, sorted(windows))  # every rank drops the same candidates, or the ranks diverge
            timed += sum(seconds[k] for _, members, _ in rounds for k in members.values())
            # A round dropped on one rank is dropped on all: each rank then reduces the same windows.
            compiled = self.reduce_max({q: float(c) for q, _, c in rounds})
            kept = {(q, i): seconds[k] / n for q, members, _ in rounds if not compiled[q] for i, k in members.items()}
            for (_, i), step_s in sorted(self.reduce_max(kept).items()):
                windows[i].append(step_s)
            # The busiest rank's CPU: a window counts as descheduled only when no rank kept working.
            used = {(q, i): clock.cpu_seconds[k] / n for q, members, _ in rounds if not compiled[q]
                    for i, k in members.items()}
            for (_, i), cpu_s in sorted(self.reduce_max(used).items()):
                cpu[i].append(cpu_s)
            for q, members, _ in rounds:
                self.progress("round", round=q, step_s={spec.labels[i]: seconds[k] / n for i, k in members.items()})
        ok = [i for i in windows if outcome[i].ok]
        return {i: windows[i] for i in ok}, {i: cpu[i] for i in ok}

    def agree(self, outcome: dict[int, TrialResult], candidates: list[int]) -> None:
        """A candidate that failed on any rank fails on every rank, with that rank's reason: ranks that went on
        with different candidates would wait in each other's collectives until NCCL's timeout.

        Through the rendezvous store, not a collective: a rank that failed in the middle of a step left the
        others inside that step's collectives, where a collective of this check would pair with theirs. Such
        ranks never report; past :data:`AGREE_S` this rank fails the process, and torchrun ends the others."""
        if self.world_size == 1 or not candidates:
            return
        from datetime import timedelta

        store = dist.distributed_c10d._get_default_store()
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

    def more_rounds(self, windows: dict[int, list[float]], cpu: dict[int, list[float]], timed: float) -> bool:
        """Rank 0 decides for every rank (the steps of DDP candidates are collective)."""
        spec = self.spec
        if rounds_done(windows) < spec.min_rounds:
            more = timed < spec.max_timed_s * 3  # dropped rounds may delay the minimum; never forever
        elif timed >= spec.max_timed_s:
            more = False
        else:
            more = worst_half_width(list(windows.values()), [cpu[i] for i in windows]) > spec.precision
        if self.world_size == 1:
            return more
        flag = torch.tensor([float(more)], device=self.device if self.device.type == "cuda" else "cpu")
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def reduce_max(self, values: dict[Any, float]) -> dict[Any, float]:
        """The slowest rank sets the pace of a synchronous job."""
        if self.world_size == 1 or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64,
                         device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(keys, t.tolist(), strict=True))


def rounds_done(windows: dict[int, list[float]], cpu: dict[int, list[float]] | None = None) -> int:
    """Rounds every candidate with windows has timed alike (``cpu``: their windows' CPU seconds, which tell a
    descheduled window from a slow one of the program's own)."""
    ok = [i for i, w in windows.items() if w]
    return len(clean_rounds(*(windows[i] for i in ok), cpu=[(cpu or {}).get(i) for i in ok])) if ok else 0


def worst_half_width(windows: list[list[float]], cpu: list[list[float]] | None = None) -> float:
    """The widest 95% half-width (of the mean log-ratio, about relative) of any candidate against the
    fastest, over the rounds they share (``cpu``: each candidate's windows' CPU seconds, aligned)."""
    cpus = cpu if cpu is not None else [None] * len(windows)
    pairs = [(w, c) for w, c in zip(windows, cpus, strict=True) if w]
    series = [w for w, _ in pairs]
    if len(series) < 2:
        return 0.0
    rounds = clean_rounds(*series, cpu=[c for _, c in pairs])
    n = len(rounds)
    if n < 2:
        return math.inf
    logs = [[math.log(w[r]) for r in rounds] for w in series]
    leader = min(logs, key=statistics.fmean)
    return max(t975(n - 1) * statistics.stdev(a - b for a, b in zip(other, leader, strict=True)) / math.sqrt(n)
               for other in logs if other is not leader)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m autocompile.trial.timing.sidebyside_worker DIR", file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        result = SideBySide(SideBySideSpec.read(out_dir), out_dir, rank).run()
    except BaseException as exc:
        failure = TrialResult(status="failed", **classify(exc), rank=rank)
        log.error("side-by-side comparison failed: %s", failure.reason, exc_info=True)
        write_json_atomic(out_dir / ("result.json" if rank == 0 else f"error.rank{rank}.json"), failure.to_json())
        logging.shutdown()
        os._exit(1)
    if rank == 0:
        write_json_atomic(out_dir / "result.json", result.to_json())
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
