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

import atexit  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from autocompile.config.choices import compiles  # noqa: E402
from autocompile.config.knobs import Env, TrialConfig  # noqa: E402
from autocompile.config.spec import TrialSpec, write_json_atomic  # noqa: E402
from autocompile.trial.program.build import (  # noqa: E402
    Built,
    NonFiniteLoss,
    align,
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
)
from autocompile.trial.program.build import window_steps as steps_per_window  # noqa: E402
from autocompile.trial.program.flops import estimated_flops_per_token, flops_per_item  # noqa: E402
from autocompile.trial.timing.clock import WindowClock  # noqa: E402
from autocompile.trial.timing.compile_artifacts import load_artifacts, save_artifacts  # noqa: E402
from autocompile.trial.timing.readings import (  # noqa: E402, F401 - PEAK_FLOPS, peak_flops: read here by scripts and tests
    PEAK_FLOPS,
    CompileInTimedPart,
    CudaGraphsSkipped,
    RanksDiverged,
    classify,
    dynamo_compile_times,
    environment,
    guard_failure_counts,
    mfu,
    peak_flops,
    peak_memory,
    recompile_reasons,
    reset_peak_memory,
    short_reason,
)
from autocompile.trial.timing.recordings import cudagraph_recordings  # noqa: E402
from autocompile.trial.timing.result import Memory, TrialResult  # noqa: E402
from autocompile.trial.timing.stats import relative_half_width  # noqa: E402
from autocompile.workload.data import count_items, item_unit  # noqa: E402
from autocompile.workload.models import build  # noqa: E402

IMPORTS_DONE = time.time()
log = logging.getLogger("autocompile.trial.timing.worker")


def main(argv: list[str] | None = None) -> int:
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
        spec = TrialSpec.read(trial_dir)
        result = Trial(spec, trial_dir, rank).run()
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


class Trial:
    def __init__(self, spec: TrialSpec, trial_dir: Path, rank: int) -> None:
        self.spec = spec
        self.trial_dir = trial_dir
        self.rank = rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.device = torch.device(spec.device)
        self.timeline: dict[str, float] = {"worker_start": WORKER_START, "imports_done": IMPORTS_DONE}
        launched = os.environ.get("AUTOCOMPILE_LAUNCH_TIME")
        if launched:
            self.timeline["launch"] = float(launched)

    def progress(self, event: str, **data: Any) -> None:
        if self.rank == 0:
            append_progress(self.trial_dir, event, **data)

    def sync(self) -> None:
        synchronize(self.device)

    def run(self) -> TrialResult:
        spec, workload = self.spec, self.spec.workload
        self.progress("started")  # the process is up: the tuner's view says "building the model"
        self.device = start_process(spec.threads, self.device, self.world_size, workload.float32_matmul_precision)

        env = Env.detect(self.device.type, self.world_size, workload.shapes_vary)
        config = TrialConfig.from_flat(spec.knobs, env)
        loaded = load_artifacts(spec.measure.artifacts) if spec.measure.artifacts else None
        built = build_candidate(spec, config, self.device, self.rank, self.world_size)
        model, step, loss_fn = built.model, built.step, built.loss_fn
        built.staged = stage(built.data, period(spec), self.device)  # none made or copied while timing
        # Per item (token, image) over one batch of each shape, before compile touches the model.
        shapes = len(workload.seq_len)
        counted = [built.batch(i) for i in range(shapes)]
        fpi = flops_per_item(lambda: build(spec.model.target, spec.model.kwargs), loss_fn, counted,
                             sum(count_items(x) for x, _ in counted), self.device) if self.rank == 0 else None
        flops = {"flops_per_token": fpi, "flops_source": "counted"} if fpi else {
            "flops_per_token": estimated_flops_per_token(model, statistics.fmean(workload.seq_len)),
            "flops_source": "6N estimate"}
        self.timeline["build_done"] = time.time()
        log.info("built %s; compiled: %s", spec.model.name, ", ".join(step.compiled) or "nothing")

        from torch._dynamo.utils import counters

        # A CUDA-graph mode whose graphs inductor declines runs as another program: its cudagraph_skips counter
        # fails the trial below (not triton.cudagraph_or_error: inductor's FX-graph cache key holds every config).

        align(self.world_size)  # rank 0 counted FLOPs alone: not in the others' first warm-up step
        warmup = warmup_steps(spec)
        warm_up(built, warmup, self.sync, self.progress)
        losses, warm_s, program = built.losses, built.warm_s, built.program
        self.timeline["warmup_done"] = time.time()
        self.progress("compiled", **program)
        artifacts = save_artifacts(self.trial_dir) if self.rank == 0 and compiles(config.compile.scope) else None
        align(self.world_size)  # nor its saving in their first window

        window_steps = steps_per_window(spec, spec.measure.window_steps)
        rewarm_s, rewarm_steps, warmup_peak, reasons = 0.0, 0, 0, []
        guards = guard_failure_counts()
        for attempt in range(2):
            # Steady state from here: compile-time buffers of the warm-up are not what the job needs.
            warmup_peak = max(warmup_peak, peak_memory(self.device))
            memory_source = reset_peak_memory(self.device)
            self.timeline["memory_reset"] = time.time()
            frames_before = counters["frames"]["total"] + cudagraph_recordings()
            window_s, window_tokens, window_cpu = self.time_windows(built, window_steps)
            recompiles_timed = counters["frames"]["total"] + cudagraph_recordings() - frames_before
            if not recompiles_timed:
                break
            reasons = recompile_reasons(guards)  # the guards that failed, as TORCH_LOGS=recompiles says them
            if attempt == 1:
                raise CompileInTimedPart(f"{recompiles_timed} frame(s) compiled or CUDA graph(s) recorded again while "
                                         "timing, after a second warm-up: the step never reaches a steady state; "
                                         f"failed guards: {'; '.join(reasons) or 'none (CUDA graphs re-recorded)'}")
            # Compile work in the timed part: those windows become warm-up, their time counts as compile.
            log.warning("%d frame(s) compiled or CUDA graph(s) recorded during the timed part: timing again; failed "
                        "guards: %s", recompiles_timed, "; ".join(reasons) or "none")
            rewarm_s += sum(window_s)
            rewarm_steps += len(window_s) * window_steps
            self.progress("rewarm", frames=recompiles_timed)
        self.timeline["timed_done"] = time.time()
        if self.device.type == "cuda" and counters["inductor"]["cudagraph_skips"]:
            raise CudaGraphsSkipped(f"inductor skipped CUDA graphs {counters['inductor']['cudagraph_skips']} time(s) "
                                    "(see stderr.log for the reason)")

        # The slowest rank sets the pace of a synchronous job.
        window_s = self.reduce_max(window_s)
        warm_s = self.reduce_max(warm_s)
        step_s = [t / window_steps for t in window_s]
        # The busiest rank's CPU seconds: a window counts as descheduled only when no rank kept working.
        step_cpu_s = [t / window_steps for t in self.reduce_max(window_cpu)]
        s = built.steps_done
        checksums = self.param_checksums(model)
        if not all(math.isclose(c, checksums[0], rel_tol=1e-9) for c in checksums):
            raise RanksDiverged(f"parameters differ across ranks after {s} steps (checksums {checksums})")
        median_step = statistics.median(step_s)
        tokens_per_s = [n * self.world_size / t for n, t in zip(window_tokens, window_s, strict=True)]
        compile_s = max(0.0, sum(warm_s) + rewarm_s - (warmup + rewarm_steps) * median_step)
        tps = statistics.median(tokens_per_s)
        return TrialResult(**{
            "status": "ok",
            "compiled": step.compiled,
            "sharded": step.sharded,
            "compile_s": compile_s,
            "first_step_s": warm_s[0],
            "warmup_step_s": warm_s,
            "dynamo_compile_s": dynamo_compile_times(),
            "step_s": median_step,
            "step_s_windows": step_s,
            "step_cpu_s_windows": step_cpu_s,
            "step_s_cv": statistics.pstdev(step_s) / statistics.fmean(step_s),
            # Half-width of the 95% interval of the mean window step time, relative (inside this process).
            "timed_precision": relative_half_width(step_s) if len(step_s) > 1 else None,
            "timed_s": sum(window_s),
            "windows": len(window_s),
            "tokens_per_s": tps,
            "tokens_per_s_windows": tokens_per_s,
            "throughput_unit": item_unit(built.batch(0)[0]),  # tokens_per_s counts samples for float inputs (images)
            **self.memory(built, warmup_peak, memory_source),
            "graph_count": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "graph_break_reasons": {short_reason(k): v for k, v in counters["graph_break"].items()},
            "recompiles_timed": recompiles_timed,
            "recompile_reasons": reasons,
            "rewarm_steps": rewarm_steps,
            "compiled_coverage": program["coverage"],
            "fingerprint": program["fingerprint"],
            "losses": [float(x) for x in torch.stack(losses).float().cpu().tolist()],
            "warmup_steps": warmup + rewarm_steps,
            "window_steps": window_steps,
            "mfu": mfu(flops["flops_per_token"], tps, self.device, self.world_size, spec.measure.peak_tflops),
            **flops,
            "compile_artifacts": artifacts,
            "artifacts_loaded": loaded,
            "param_checksums": checksums,
            "timeline": self.timeline,
            "environment": environment(self.device, self.rank, spec.threads),
        })

    def time_windows(self, built: Built, window_steps: int) -> tuple[list[float], list[int], list[float]]:
        """Timed windows until :meth:`more_windows` says enough; seconds, items and process CPU seconds of
        each. On CUDA the windows' times are read (one synchronisation) only where the next decision needs
        them."""
        m = self.spec.measure
        clock = WindowClock(self.device, self.sync)
        window_s: list[float] = []
        window_tokens: list[int] = []
        checked = len(built.losses)
        while self.more_windows(window_s):
            for _ in range(clock.before_deciding(len(window_s), m.windows)):
                clock.start()
                window_tokens.append(built.run(window_steps))
                clock.stop()
            resolved = clock.resolve()
            check_finite(built.losses[checked:], built.steps_done)
            checked = len(built.losses)
            for w in range(len(window_s), len(resolved)):
                self.progress("window", window=w, seconds=resolved[w], step_s=resolved[w] / window_steps)
            window_s = list(resolved)
        return window_s, window_tokens, list(clock.cpu_seconds)

    def memory(self, built: Built, warmup_peak: int, source: str) -> Memory:
        """Peak memory of the timed part (the largest rank's), without the staged batches beyond
        one step's (a job holds the batch it trains on, not a ring of them); the warm-up's peak apart."""
        steady = peak_memory(self.device)
        if self.device.type == "cuda" and built.staged:
            sizes = [sum(t.numel() * t.element_size() for t in tensors(b)) for b in built.staged]
            steady = max(0, steady - (sum(sizes) - max(sizes)))
        steady, warmup_peak = (int(v) for v in self.reduce_max([float(steady), float(warmup_peak)]))
        return {"peak_memory_bytes": steady, "warmup_peak_memory_bytes": warmup_peak, "memory_source": source}

    def more_windows(self, window_s: list[float]) -> bool:
        """Another timed window? ``measure.windows`` at least; then until the mean window step time is
        known to ``measure.precision`` (95% interval) or ``measure.max_timed_s`` is spent.

        Every rank must decide alike (DDP steps are collective): rank 0's windows decide for all."""
        m = self.spec.measure
        if len(window_s) < m.windows:
            return True
        if not m.precision:
            return False
        more = sum(window_s) < m.max_timed_s and relative_half_width(window_s) > m.precision
        if self.world_size == 1:
            return more
        flag = torch.tensor([float(more)], device=self.device if self.device.type == "cuda" else "cpu")
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def reduce_max(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

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


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: after dynamo is loaded, freeing every module takes
    about 2 s per process (more than this tiny trial's timed part), which each trial would pay.
    Exit handlers still run (inductor's compile workers stop), and the streams are flushed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
