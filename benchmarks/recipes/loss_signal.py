"""How well the study's numerics check sees a step that does not train.

Runs the default burst length (3 warm-up + 5 x 5 timed steps = 28) eagerly on a small GPT-2 with
the full 50257-token vocabulary, three ways: training, frozen (lr 0: a step that does not train)
and bf16 autocast, and prints each one's loss and its largest per-step drift from the fp32 run,
next to the study's default tolerance (objective.loss_rtol).

    python benchmarks/recipes/loss_signal.py [--steps 28] [--layers 2] [--width 64]
"""

from __future__ import annotations

import argparse

import torch

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.settings import ObjectiveSettings
from autocompile.study.records.objective import loss_drift
from autocompile.trial.program.step import apply, lm_loss
from autocompile.workload.data import SyntheticTokens
from autocompile.workload.models import gpt2


def losses(args: argparse.Namespace, lr: float, knobs: dict[str, str]) -> list[float]:
    torch.manual_seed(0)
    model = gpt2(n_layer=args.layers, n_embd=args.width, n_head=2, n_positions=args.seq_len)
    config = TrialConfig.from_flat({"compile.scope": "none", **knobs}, Env.detect("cpu", 1, False))
    step = apply(model, torch.optim.AdamW(model.parameters(), lr=lr), lm_loss, config)
    data = SyntheticTokens(model.config.vocab_size, args.batch_size, [args.seq_len], seed=0)
    return [float(step(*data.batch(i))) for i in range(args.steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    reference = losses(args, args.lr, {})
    print(f"tolerance (objective.loss_rtol): {ObjectiveSettings().loss_rtol:.1%}")
    for name, lr, knobs in (("fp32 training", args.lr, {}), ("frozen (lr 0)", 0.0, {}),
                            ("bf16 autocast", args.lr, {"amp.dtype": "bfloat16"})):
        run = reference if name == "fp32 training" else losses(args, lr, knobs)
        drift = loss_drift(run, reference)
        print(f"{name:>14}: loss {run[0]:.3f} -> {run[-1]:.3f}, largest drift from fp32 {drift:.2%}")


if __name__ == "__main__":
    main()
