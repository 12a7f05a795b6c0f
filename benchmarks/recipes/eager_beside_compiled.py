"""Does eager slow down beside a compiled copy in one process (issue 35), and what moves with it?

One process holds nanoGPT's own GPT at issue 26's size twice (``examples/models/nanogpt.py``), an eager copy and
a ``torch.compile`` copy (inductor), each with its own AdamW, and times them in alternating windows of
``--steps`` training steps, with a pure-Python control loop after each pair (no tensors, no allocator, one core).
Per window: wall and process CPU seconds, minor page faults, the resident set. The eager/compiled ratio of a
window pair cancels what the machine does to both (its speed changes in stretches on this VM:
``speed_change_probe.py``); a change point in that ratio is the program's own, and the faults and RSS say
whether memory moved with it.

    python benchmarks/recipes/eager_beside_compiled.py --windows 120
    python benchmarks/recipes/eager_beside_compiled.py --windows 120 --no-compiled   # eager alone (control)
    python benchmarks/recipes/eager_beside_compiled.py --windows 120 --bind pinned   # threads pinned meanwhile

The last line sums it up: windows in slow stretches (the compiled copy over 1.2x its fastest decile) and the
eager/compiled ratio inside and outside them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.recipes.speed_change_probe import control  # the same one-thread loop


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _ticks(tid: int) -> int:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def pinned(threads: int) -> Iterator[list[int]]:
    """This thread and the ``threads - 1`` busiest others (after a warm-up: the OpenMP team) each on a core of its
    own for the body, all released after: OMP_PROC_BIND's binding without its pinning of every child process."""
    import threading

    cores = sorted(os.sched_getaffinity(0))
    me = threading.get_native_id()
    others = sorted((int(t) for t in os.listdir("/proc/self/task") if int(t) != me), key=_ticks, reverse=True)
    tids = [me, *others[:threads - 1]][:len(cores)]
    for tid, core in zip(tids, cores, strict=False):
        os.sched_setaffinity(tid, {core})
    try:
        yield cores[:len(tids)]
    finally:
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, set(cores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=120)
    parser.add_argument("--steps", type=int, default=10, help="training steps per window")
    parser.add_argument("--no-compiled", action="store_true", help="the second copy runs eager too")
    parser.add_argument("--bind", choices=("none", "all", "workers", "pinned"), default="none",
                        help="OpenMP threads bound to cores (OMP_PROC_BIND=close, OMP_PLACES=cores); 'workers': the "
                             "main thread released to every core once the team exists (children inherit that); "
                             "'pinned': autocompile's own pinning by thread id for the timed windows")
    args = parser.parse_args()
    cores = os.sched_getaffinity(0)
    if args.bind in ("all", "workers"):
        os.environ.update(OMP_PROC_BIND="close", OMP_PLACES="cores")  # read once, as libgomp loads
    import torch

    torch.set_num_threads(args.threads)
    if args.bind == "workers":
        torch.ones(4096, 4096).sum()  # the team starts, each worker bound to its core
        os.sched_setaffinity(0, cores)
        for name in ("OMP_PROC_BIND", "OMP_PLACES"):
            os.environ.pop(name)

    from autocompile.study.statistics.noise import change_point
    from examples.models.nanogpt import tiny

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    eager = tiny()
    other = copy.deepcopy(eager)
    runner = other if args.no_compiled else torch.compile(other)
    ids = torch.randint(0, 65, (8, 129))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def stepper(model: torch.nn.Module, params: torch.nn.Module):
        opt = torch.optim.AdamW(params.parameters(), lr=1e-3)

        def step() -> None:
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    steps = {"eager": stepper(eager, eager), "second": stepper(runner, other)}
    for step in steps.values():
        for _ in range(5):
            step()
    rows: dict[str, list[tuple[float, float, int, float]]] = {k: [] for k in steps}
    controls = []
    stack = contextlib.ExitStack()
    used = stack.enter_context(pinned(torch.get_num_threads())) if args.bind == "pinned" else []
    for _ in range(args.windows):
        for name, step in steps.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            rows[name].append((wall / args.steps, cpu / args.steps, faults, rss_mb()))
        controls.append(control())
    second = "eager copy" if args.no_compiled else "compiled"
    stack.close()
    print(f"main thread on cores {sorted(os.sched_getaffinity(0))}; bind {args.bind}; pinned to {used}")
    print(f"threads {args.threads}, {args.windows} window pairs of {args.steps} steps; second copy: {second}; "
          f"torch {torch.__version__}")
    print("window  eager ms  cpu ms  faults   rss MB | second ms  cpu ms  faults | eager/second  control ms")
    for i in range(args.windows):
        (ew, ec, ef, er), (sw, sc, sf, _) = rows["eager"][i], rows["second"][i]
        print(f"{i:6d} {ew * 1e3:9.2f} {ec * 1e3:7.2f} {ef:7d} {er:8.1f} | {sw * 1e3:9.2f} {sc * 1e3:7.2f} {sf:7d} |"
              f" {ew / sw:12.3f} {controls[i] * 1e3:11.2f}")
    ratio = [e[0] / s[0] for e, s in zip(rows["eager"], rows["second"], strict=True)]
    second_s = [r[0] for r in rows["second"]]
    floor = sorted(second_s)[len(second_s) // 10]
    slow = [i for i, w in enumerate(second_s) if w > 1.2 * floor]
    fast = [i for i in range(args.windows) if i not in set(slow)]
    for name, series, cpu in (("eager", [r[0] for r in rows["eager"]], [r[1] for r in rows["eager"]]),
                              ("second", [r[0] for r in rows["second"]], [r[1] for r in rows["second"]]),
                              ("eager/second", ratio, None), ("control", controls, None)):
        found = change_point(series, cpu)
        med = statistics.median(series)
        if found is None:
            print(f"change point in {name} (median {med:.4g}): none")
            continue
        pace = "" if found.cpu_kept_pace is None else f"; CPU time {'grew with it' if found.cpu_kept_pace else 'flat'}"
        print(f"change point in {name} (median {med:.4g}): at window {found.at} ({found.before_s:.4g} -> "
              f"{found.after_s:.4g}, {found.change:+.0%}{pace})")

    def mean_ratio(idx: list[int]) -> str:
        return f"{statistics.fmean(ratio[i] for i in idx):.3f}" if idx else "-"
    print(f"summary: bind {args.bind}; median eager {statistics.median(r[0] for r in rows['eager']) * 1e3:.2f} ms, "
          f"second {statistics.median(second_s) * 1e3:.2f} ms; slow windows {len(slow)}/{args.windows}; eager/second "
          f"outside them {mean_ratio(fast)}, inside {mean_ratio(slow)}; "
          f"control {statistics.median(controls) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
