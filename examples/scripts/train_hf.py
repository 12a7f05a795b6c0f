"""A transformers model in a plain loop: a GPT-2 from its config, AdamW, a linear warm-up schedule, its own
``torch.compile(model)``; tuned by autocompile with no line changed.

The model returns its loss (``labels=``), the scheduler steps after the optimizer, gradients are clipped. The
data is a fixed random token stream (any stream serves for timing).

    python examples/scripts/train_hf.py --max_iters=100
    python -m autocompile script.path=examples/scripts/train_hf.py script.args='--max_iters=100'
"""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--seq_len", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=2)
parser.add_argument("--n_embd", type=int, default=64)
parser.add_argument("--n_head", type=int, default=2)
parser.add_argument("--vocab_size", type=int, default=256)
parser.add_argument("--max_iters", type=int, default=100)
parser.add_argument("--warmup_iters", type=int, default=10)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()


def main():
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = GPT2Config(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, vocab_size=args.vocab_size,
                        n_positions=max(128, args.seq_len))
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup_iters, args.max_iters)
    if args.compile:
        model = torch.compile(model)
    data = torch.randint(0, args.vocab_size, (50_000,), generator=torch.Generator().manual_seed(args.seed))
    for step in range(args.max_iters):
        ix = torch.randint(len(data) - args.seq_len, (args.batch_size,))
        batch = torch.stack([data[i:i + args.seq_len] for i in ix]).to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")


if __name__ == "__main__":
    main()
