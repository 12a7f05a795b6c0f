"""examples/train_own.py: a user's own job (optimizer, schedule, clipping, accumulation) through autocompile.apply."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from examples import train_own
from tests.jobs import Compose

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_trains_with_its_own_parts_under_the_applied_configuration() -> None:
    knobs = ["compile.scope=regional", "compile.optimizer=true", "optim.clip=compiled", "compile.backend=eager"]
    # This checkout's autocompile, installed or not (a script's own folder is on its path, not the cwd).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "examples/train_own.py", "--steps", "6", "--accum", "2", "--knobs", *knobs],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = re.search(r"compiled: (.*)", done.stderr).group(1)
    # Every block, the rest of the net, and the optimizer step with clipping inside it.
    assert compiled.split(", ") == ["blocks.0", "blocks.1", "blocks.2", "stem", "head",
                                    "optimizer.step+clip_grad_norm_"]
    first, last, steps = re.search(r"loss ([\d.]+) -> ([\d.]+) over 6 optimizer steps; .* stepped (\d+) times",
                                   done.stderr).groups()
    assert float(last) < float(first)
    assert int(steps) == 6  # the schedule steps once per optimizer step, not per micro-batch


def test_the_example_as_a_study_composes_with_its_parts(settings_for: Compose) -> None:
    command = train_own.__doc__.split("python -m autocompile", 1)[1].replace("\\\n", " ")
    settings = settings_for(*shlex.split(command), "workload.device=cpu")
    w = settings.workload
    assert w.data["_target_"] == "examples.train_own.batches" and w.grad_accum_steps == 2 and w.grad_clip_norm == 1.0
    assert w.lr_schedule["_target_"] == "examples.train_own.make_schedule"
    env = settings.env
    assert env.scheduled and env.clips and env.optimizer_impls == ()  # its factory names no foreach/fused
