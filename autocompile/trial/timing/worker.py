"""One trial, in a fresh process per rank: ``python -m autocompile.trial.timing.worker TRIAL_DIR``.

Run under torchrun (any world size) or alone (world size 1). Reads ``trial.json``, builds the
model, applies the configuration, warms up over every shape the data uses (this is where
compilation happens), then times several windows (:mod:`autocompile.trial.timing.clock`). Rank 0 writes
``result.json`` atomically and appends progress events to ``progress.jsonl`` so the tuner can
stop a hopeless trial early. A failure is a result too: ``status: failed`` with its kind and reason.

Imports nothing of the tuner's stack (Optuna, Hydra, MLflow): it runs where only PyTorch is.
"""

from __future__ import annotations

import time

WORKER_START = time.time()

import contextlib  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from autocompile.config.choices import compiles  # noqa: E402
from autocompile.config.knobs import Env, TrialConfig  # noqa: E402
from autocompile.config.spec import SideBySideSpec, TrialSpec, write_json_atomic  # noqa: E402
from autocompile.trial.program.build import (  # noqa: E402
    Built,
    NonFiniteLoss,
    align,
    start_process,
    tensors,
    warm_up,
    warmup_steps,
)
from autocompile.trial.program.build import window_steps as steps_per_window  # noqa: E402
from autocompile.trial.program.flops import estimated_flops_per_token, flops_per_item  # noqa: E402
from autocompile.trial.timing.clock import WindowClock  # noqa: E402
from autocompile.trial.timing.compile_artifacts import load_artifacts, save_artifacts  # noqa: E402
from autocompile.trial.timing.model_rounds import ModelProcess, time_rounds  # noqa: E402
from autocompile.trial.timing.ranks import exit_now, reduce_max  # noqa: E402
from autocompile.trial.timing.readings import (  # noqa: E402
    CompileInTimedPart,
    RanksDiverged,
    check_cuda_graphs,
    classify,
    dynamo_compile_times,
    environment,
    guard_failure_counts,
    loss_values,
    mfu,
    peak_memory,
    recompile_reasons,
    reset_peak_memory,
    set_graphs,
    tree_cpu_s,
)
from autocompile.trial.timing.result import TrialResult  # noqa: E402
from autocompile.trial.timing.rounds import Rounds, set_timing  # noqa: E402
from autocompile.trial.timing.sidebyside_worker import SideBySide  # noqa: E402
from autocompile.trial.timing.turn import end_turn, wait_turn  # noqa: E402
from autocompile.workload.data import count_items, item_unit  # noqa: E402
from autocompile.workload.models import build  # noqa: E402

IMPORTS_DONE = time.time()
log = logging.getLogger("autocompile.trial.timing.worker")


def main(argv: list[str] | None = None) -> int:
    """One model-path process: a trial (``trial.json``) or candidates side by side (``sidebyside.json``)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m autocompile.trial.timing.worker TRIAL_DIR", file=sys.stderr)
        return 2
    trial_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if (trial_dir / "sidebyside.json").is_file():
            result = SideBySide(SideBySideSpec.read(trial_dir), trial_dir, rank, WORKER_START).run()
        else:
            result = Trial(TrialSpec.read(trial_dir), trial_dir, rank).run()
    except BaseException as exc:
        failure = TrialResult.failed(classify(exc), rank, environment(None, rank))
        log.error("trial failed: %s", failure.reason, exc_info=not isinstance(exc, NonFiniteLoss))
        name = "result.json" if rank == 0 else f"error.rank{rank}.json"
        write_json_atomic(trial_dir / name, failure.to_json())
        logging.shutdown()
        # Other ranks may wait in a collective forever; torchrun tears them down once we exit.
        os._exit(1)
    if rank == 0:
        write_json_atomic(trial_dir / "result.json", result.to_json())
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


class Trial(ModelProcess):
    """One configuration: built, warmed up (compiled), timed in the windows of the one scheduler, checked."""

    def __init__(self, spec: TrialSpec, trial_dir: Path, rank: int) -> None:
        super().__init__(trial_dir, rank, spec.device, {"worker_start": WORKER_START, "imports_done": IMPORTS_DONE})
        self.spec = spec
        self.trial_dir = trial_dir

    def run(self) -> TrialResult:
        spec, workload = self.spec, self.spec.workload
        self.progress("started")  # the process is up: the tuner's view says "building the model"
        self.device = start_process(spec.threads, self.device, self.world_size, workload.float32_matmul_precision)

        env = Env.detect(self.device.type, self.world_size, workload.shapes_vary)
        config = TrialConfig.from_flat(spec.knobs, env)
        loaded = load_artifacts(spec.measure.artifacts) if spec.measure.artifacts else None
        built = self.build(spec, config)
        model, step, loss_fn = built.model, built.step, built.loss_fn
        # Per item (token, image) over one batch of each shape, before compile touches the model.
        shapes = len(workload.seq_len)
        counted = [built.batch(i) for i in range(shapes)]
        fpi = flops_per_item(lambda: build(spec.model.target, spec.model.kwargs), loss_fn, counted,
                             sum(count_items(x) for x, _ in counted), self.device) if self.rank == 0 else None
        self.timeline["build_done"] = time.time()
        log.info("built %s; compiled: %s", spec.model.name, ", ".join(step.compiled) or "nothing")

        align(self.world_size)  # rank 0 counted FLOPs alone: not in the others' first warm-up step
        warmup = warmup_steps(spec)
        cpu_before = tree_cpu_s()  # a compile's CPU seconds: what a process compiling beside it barely changes
        warm_up(built, warmup, self.sync, self.progress)
        warm_cpu_s = tree_cpu_s() - cpu_before
        losses, warm_s, program = built.losses, built.warm_s, built.program
        self.timeline["warmup_done"] = time.time()
        self.progress("compiled", **program)
        artifacts = save_artifacts(self.trial_dir) if self.rank == 0 and compiles(config.compile.scope) else None
        wait_turn(self.trial_dir, self.rank, self.progress)  # the device alone from here: other trials paused
        align(self.world_size)  # nor its saving in their first window

        window_steps = steps_per_window(spec, spec.measure.window_steps)
        # Steady state from here: compile-time buffers of the warm-up are not what the job needs.
        warmup_peak = peak_memory(self.device)
        memory_source = reset_peak_memory(self.device)
        self.timeline["memory_reset"] = time.time()
        guards = guard_failure_counts()
        rounds = Rounds([0], spec.measure.policy(window_steps))
        failed = time_rounds(rounds, {0: built}, WindowClock(self.device, self.sync), self.progress, [spec.model.name],
                             lambda _: contextlib.nullcontext())
        if failed:
            raise CompileInTimedPart(failed[0])
        timed = rounds.of[0]
        reasons = recompile_reasons(guards) if timed.rewarm_steps else []
        self.timeline["timed_done"] = time.time()
        end_turn(self.rank, self.progress)
        check_cuda_graphs(self.device)

        s = built.steps_done
        checksums = self.param_checksums(model)
        if not all(math.isclose(c, checksums[0], rel_tol=1e-9) for c in checksums):
            raise RanksDiverged(f"parameters differ across ranks after {s} steps (checksums {checksums})")
        result = TrialResult(
            status="ok", compiled=step.compiled, sharded=step.sharded, dynamo_compile_s=dynamo_compile_times(),
            throughput_unit=item_unit(built.batch(0)[0]),  # tokens_per_s counts samples for float inputs (images)
            recompiles_timed=0, recompile_reasons=reasons, compiled_coverage=program["coverage"],
            fingerprint=program["fingerprint"], losses=loss_values(losses),
            flops_per_token=fpi or estimated_flops_per_token(model, statistics.fmean(workload.seq_len)),
            flops_source="counted" if fpi else "6N estimate", compile_artifacts=artifacts, artifacts_loaded=loaded,
            param_checksums=checksums, timeline=self.timeline,
            environment=environment(self.device, self.rank, spec.threads))
        # the slowest rank sets the pace of a synchronous job (the windows are every rank's slowest already)
        set_timing(result, timed, reduce_max(warm_s), warmup, window_steps, self.world_size)
        steady_cpu = statistics.median(timed.cpu_s) if timed.cpu_s else 0.0
        result.compile_cpu_s = max(0.0, reduce_max([warm_cpu_s])[0] - (warmup + timed.rewarm_steps) * steady_cpu)
        set_graphs(result)
        result.peak_memory_bytes, result.warmup_peak_memory_bytes = self.memory(built, warmup_peak)
        result.memory_source = memory_source
        result.mfu = mfu(result.flops_per_token, result.tokens_per_s, self.device, self.world_size,
                         spec.measure.peak_tflops)
        return result

    def memory(self, built: Built, warmup_peak: int) -> tuple[int, int]:
        """Peak memory of the timed part (the largest rank's), without the staged batches beyond
        one step's (a job holds the batch it trains on, not a ring of them); the warm-up's peak apart."""
        steady = peak_memory(self.device)
        if self.device.type == "cuda" and built.staged:
            sizes = [sum(t.numel() * t.element_size() for t in tensors(b)) for b in built.staged]
            steady = max(0, steady - (sum(sizes) - max(sizes)))
        steady, warmup_peak = (int(v) for v in reduce_max([float(steady), float(warmup_peak)]))
        return steady, warmup_peak

    def param_checksums(self, model: torch.nn.Module) -> list[float]:
        """One number per rank: DDP ranks must end the burst with identical parameters. FSDP2's sharded
        parameters (DTensors) count whole, all-gathered (every rank calls this), so the number stands for the
        model each rank trains; that their gradients were reduced shows in the losses against the reference."""
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            local = sum((p.full_tensor() if isinstance(p, DTensor) else p).double().sum() * (i + 1)
                        for i, p in enumerate(model.parameters()))
        mine = torch.tensor([float(local)], dtype=torch.float64)
        if self.world_size == 1:
            return mine.tolist()
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        if self.device.type == "cuda":
            mine, gathered = mine.to(self.device), [g.to(self.device) for g in gathered]
        dist.all_gather(gathered, mine)
        return [float(g) for g in gathered]


if __name__ == "__main__":
    exit_now(main())
