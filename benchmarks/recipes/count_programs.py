"""How many configurations a study's space holds, and how many distinct programs they compile to.

Every configuration of the space (inductor's mode aside) is applied in this process with the
``aot_eager`` backend and run for one step, and its program fingerprint taken: the post-autograd
aten graphs, which is what inductor's cache key hashes, plus what shapes the eager rest of the step.
Inductor's mode changes every cache key (its settings are part of it), so each compiled program
counts once per mode offered here. Programs are what a study can tell apart; the rest of the space
is the same program under another name.

    python benchmarks/recipes/count_programs.py --model gpt2-tiny

Configurations are taken in a seeded random order, and Ctrl-C (or SIGTERM) prints the summary of
those done so far: a partial run is a uniform sample of the space.
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autocompile.config.knobs import KNOBS, Env, TrialConfig
from autocompile.config.space import SearchSpace
from autocompile.config.spec import Workload
from autocompile.trial.program.graphs import listening, verify
from autocompile.trial.program.step import apply, lm_loss
from autocompile.workload.data import SyntheticTokens
from autocompile.workload.models import build
from autocompile.workload.parts import knob_facts
from autocompile.workload.units import Structure


def fingerprint(target: str, kwargs: dict[str, Any], vocab: int, knobs: dict[str, Any], env: Env) -> str:
    torch._dynamo.reset()
    config = TrialConfig.from_flat(knobs, env)
    torch.manual_seed(0)
    model = build(target, kwargs)
    # A factory, as the worker passes it: optim.impl builds the optimizer with its foreach/fused flag.
    step = apply(model, torch.optim.AdamW, lm_loss, config)
    data = SyntheticTokens(vocab, 2, [16], seed=0)
    with listening(step.log):  # inductor's cache keys, named while it compiles
        step(*data.batch(0))  # one step compiles forward, backward, optimizer and compiled autograd
    return verify(step, model, config.compile.scope)["fingerprint"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-tiny", help="a conf/model/NAME.yaml")
    parser.add_argument("--seed", type=int, default=0, help="order in which configurations are fingerprinted")
    args = parser.parse_args()
    conf = Path(__file__).resolve().parents[2] / "conf" / "model" / f"{args.model}.yaml"
    node = yaml.safe_load(conf.read_text())
    target, vocab = node.pop("_target_"), node["vocab_size"]
    node.pop("name", None)
    with torch.device("meta"):
        structure = Structure.of(build(target, node))
    # The default workload's parts (AdamW, no schedule, no clipping) decide which optimizer knobs apply.
    env = Env.detect("cpu", 1, False, structure, knob_facts(Workload(), "cpu"))
    total = SearchSpace(env, {}).size()
    modes = len(env.modes)
    aot = SearchSpace(env, {"compile.backend": "aot_eager"}).configurations()
    random.Random(args.seed).shuffle(aot)
    started = time.time()
    programs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    failed = done = 0
    # SIGINT too: a shell script's background job starts with SIGINT ignored, and Python keeps that.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    try:
        for i, knobs in enumerate(aot):
            try:
                programs[fingerprint(target, node, vocab, knobs, env)].append(knobs)
            except Exception as exc:  # noqa: BLE001 (a configuration that fails is a program of its own)
                failed += 1
                programs[f"failed:{type(exc).__name__}:{i}"].append(knobs)
            done = i + 1
            print(f"\r{done}/{len(aot)} configurations, {len(programs)} programs", end="", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\nstopped after {done} of {len(aot)} configurations (a uniform sample)", file=sys.stderr)
    print(file=sys.stderr)
    eager = {fp for fp, group in programs.items() if all(k["compile.scope"] == "none" for k in group)}
    compiled = len(programs) - len(eager)
    print(f"model {args.model}, CPU, world size 1, torch {torch.__version__}; structure {structure}")
    print(f"configurations in the study's space (inductor, {modes} modes {env.modes}): {total}")
    print(f"  without the mode: {len(aot)} ({sum(k['compile.scope'] == 'none' for k in aot)} eager); "
          f"fingerprinted: {done}{' (all)' if done == len(aot) else ' (a uniform random sample)'}")
    print(f"distinct programs: {len(eager)} eager + {compiled} compiled x {modes} modes = "
          f"{len(eager) + compiled * modes} (failed configurations: {failed}); fingerprinted in "
          f"{time.time() - started:.0f} s")
    if done < len(aot):  # a uniform sample without replacement: Chao & Lin (2012)'s richness estimate
        sizes = collections.Counter(len(group) for group in programs.values())
        f1, f2, q = sizes[1], sizes[2], done / len(aot)
        estimate = float(len(programs))
        if f1 and done > 1:
            estimate += f1 * f1 / (2 * f2 * done / (done - 1) + q / (1 - q) * f1)
        print(f"programs seen once: {f1}, twice: {f2}; estimated distinct programs among the {len(aot)} "
              f"configurations (Chao-Lin, sampling without replacement): {estimate:.0f} (at least {len(programs)})")
    same = collections.Counter()
    for group in programs.values():
        if len(group) > 1:
            for key in KNOBS:
                if len({repr(k.get(key)) for k in group}) > 1:
                    same[key] += 1
    print("knobs that vary inside a group of identical programs (groups):",
          ", ".join(f"{k} ({n})" for k, n in same.most_common()))


if __name__ == "__main__":
    main()
