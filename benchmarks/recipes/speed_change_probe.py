"""Why a process changes speed (issue 26): time one program's windows beside a control that shares nothing
with it, in one process, and see which moves.

Each window runs ``--steps`` eager training steps of nanoGPT's own GPT at issue 26's size
(``examples/models/nanogpt.py``: 2 layers, n_embd 64, batch 8, 128 tokens), then a fixed pure-Python
integer loop (the control: no tensors, no allocator, no OpenMP threads, one core). Per window it records
the step's wall and process CPU seconds, the control's wall seconds, the machine's steal time
(``/proc/stat``) and the process's page faults. Then :func:`autocompile.study.statistics.noise.change_point` on each
series:

- the steps shift and the control shifts with them: the machine changed speed (the host, its frequency,
  a neighbour VM), whatever the program does;
- the steps shift alone, CPU time with them: the program's own (allocator, OpenMP threads' spinning);
- the steps shift alone, CPU time flat: the process waited (descheduled).

    python benchmarks/recipes/speed_change_probe.py --threads 2 --windows 60
    python benchmarks/recipes/speed_change_probe.py --threads 1 --windows 60   # no OpenMP team to spin
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def steal_s() -> float:
    """The machine's steal time so far (all CPUs), seconds: time the hypervisor ran someone else."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def control(n: int = 300_000) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFF
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10, help="training steps per window")
    args = parser.parse_args()
    import torch

    from autocompile.study.statistics.noise import change_point
    from examples.models.nanogpt import tiny

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 65, (8, 129))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    rows = []
    for _ in range(args.windows):
        faults = resource.getrusage(resource.RUSAGE_SELF)
        steal, wall, cpu = steal_s(), time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ctl = control()
        after = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((wall / args.steps, cpu / args.steps, ctl, steal_s() - steal,
                     (after.ru_minflt - faults.ru_minflt) + (after.ru_majflt - faults.ru_majflt)))
    print(f"threads {args.threads}, {args.windows} windows of {args.steps} steps; torch {torch.__version__}")
    print("window  step ms  cpu ms  cpu/wall  control ms  steal s  faults")
    for i, (w, c, ctl, st, f) in enumerate(rows):
        print(f"{i:6d} {w * 1e3:8.2f} {c * 1e3:7.2f} {c / w:9.2f} {ctl * 1e3:11.2f} {st:8.2f} {f:7d}")
    steps, cpus, controls = ([r[k] for r in rows] for k in (0, 1, 2))
    print(f"median step {statistics.median(steps) * 1e3:.2f} ms (min {min(steps) * 1e3:.2f}, max "
          f"{max(steps) * 1e3:.2f}); control {statistics.median(controls) * 1e3:.2f} ms (min "
          f"{min(controls) * 1e3:.2f}, max {max(controls) * 1e3:.2f}); steal {sum(r[3] for r in rows):.2f} s")
    for name, series, cpu in (("steps", steps, cpus), ("control", controls, None)):
        found = change_point(series, cpu)
        if found is None:
            print(f"change point in the {name}: none")
            continue
        pace = "" if found.cpu_kept_pace is None else \
            f"; CPU time {'grew with it' if found.cpu_kept_pace else 'flat'}"
        print(f"change point in the {name}: at window {found.at} ({found.before_s * 1e3:.2f} -> "
              f"{found.after_s * 1e3:.2f} ms{pace})")


if __name__ == "__main__":
    main()
