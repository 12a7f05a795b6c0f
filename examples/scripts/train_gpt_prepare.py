"""train_gpt.py with the one line: ``model, optimizer = autocompile.prepare(model, optimizer)``.

The same nanoGPT-shaped loop (module-level, its own autocast, GradScaler, accumulation under
``require_backward_grad_sync``, clipping, DDP, an eval at step 0); ``prepare`` stands where train_gpt.py calls
``torch.compile(model)``. Run as a user runs it, it trains eager and exactly as before; with a study's winner
named (``AUTOCOMPILE_BEST_CONFIG=.../best_config.yaml``) ``prepare`` applies it in place; in a study's trial it
hands the model to the trial's agent (the trial's compile knobs, applied in place before DDP).

    python examples/scripts/train_gpt_prepare.py --max_iters=200
    AUTOCOMPILE_BEST_CONFIG=outputs/<study>/best_config.yaml python examples/scripts/train_gpt_prepare.py
    python -m autocompile script.path=examples/scripts/train_gpt_prepare.py script.args='--max_iters=5000'
"""

import argparse
import contextlib
import math
import os
import time

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import autocompile

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--block_size", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=4)
parser.add_argument("--n_head", type=int, default=4)
parser.add_argument("--n_embd", type=int, default=128)
parser.add_argument("--vocab_size", type=int, default=512)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
parser.add_argument("--learning_rate", type=float, default=6e-4)
parser.add_argument("--max_iters", type=int, default=100)
parser.add_argument("--grad_clip", type=float, default=1.0)
parser.add_argument("--eval_interval", type=int, default=50)
parser.add_argument("--eval_iters", type=int, default=2)
parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--out_dir", default="")
args = parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# -- the job, at module level as nanoGPT's train.py has it ---------------------------------------------------
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if torch.cuda.is_available() else "cpu"
    torch.distributed.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    master_process = int(os.environ["RANK"]) == 0
    seed_offset = int(os.environ["RANK"])
    assert args.gradient_accumulation_steps % int(os.environ["WORLD_SIZE"]) == 0
    args.gradient_accumulation_steps //= int(os.environ["WORLD_SIZE"])
else:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    master_process, seed_offset = True, 0
torch.manual_seed(args.seed + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
if device_type == "cpu" and args.dtype == "float16":
    ptdtype = torch.bfloat16  # no float16 autocast worth running on a CPU
ctx = contextlib.nullcontext() if args.dtype == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)

data = torch.randint(0, args.vocab_size, (200_000,), generator=torch.Generator().manual_seed(args.seed))


def get_batch():
    ix = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
    x = torch.stack([data[i:i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.block_size] for i in ix])
    return x.to(device), y.to(device)


model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd).to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(device_type == "cuda" and args.dtype == "float16"))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
model, optimizer = autocompile.prepare(model, optimizer)  # the one line
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(args.eval_iters)
    for k in range(args.eval_iters):
        X, Y = get_batch()
        with ctx:
            _, loss = model(X, Y)
        losses[k] = loss.item()
    model.train()
    return losses.mean()


def get_lr(it):
    warmup = 10
    if it < warmup:
        return args.learning_rate * (it + 1) / (warmup + 1)
    return args.learning_rate * 0.5 * (1 + math.cos(math.pi * min(1.0, (it - warmup) / max(1, args.max_iters))))


X, Y = get_batch()
t0 = time.time()
for iter_num in range(args.max_iters + 1):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)
    if iter_num % args.eval_interval == 0 and master_process:
        print(f"step {iter_num}: val loss {estimate_loss():.4f}")
        if args.out_dir and iter_num > 0:
            os.makedirs(args.out_dir, exist_ok=True)
            torch.save({"model": raw_model.state_dict(), "iter_num": iter_num}, os.path.join(args.out_dir, "ckpt.pt"))
    if iter_num == args.max_iters:
        break
    for micro_step in range(args.gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == args.gradient_accumulation_steps - 1
        with ctx:
            _, loss = model(X, Y)
            loss = loss / args.gradient_accumulation_steps
        X, Y = get_batch()
        scaler.scale(loss).backward()
    if args.grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % 10 == 0 and master_process:
        print(f"iter {iter_num}: loss {loss.item() * args.gradient_accumulation_steps:.4f}, "
              f"time {(time.time() - t0) * 1000:.0f} ms")
        t0 = time.time()

if ddp:
    torch.distributed.destroy_process_group()
