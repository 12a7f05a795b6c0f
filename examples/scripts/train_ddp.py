"""A 2-rank DDP script under torchrun: ``init_process_group``, ``DDP(model)``, ``torch.compile`` of the DDP
module, synthetic data per rank (no DistributedSampler); tuned by autocompile with no line changed.

gloo on a CPU, nccl on GPUs. Each rank draws its own batches from its own seed, so the ranks see different data
as a sampler would give them.

    torchrun --nproc-per-node=2 examples/scripts/train_ddp.py --max_iters=50
    python -m autocompile script.path=examples/scripts/train_ddp.py script.args='--max_iters=50' \
        workload.nproc_per_node=2
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--n_layer", type=int, default=3)
parser.add_argument("--max_iters", type=int, default=50)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim, n_layer):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim) for _ in range(n_layer)])
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


def main():
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(Net(args.dim, args.n_layer).to(device), device_ids=[local_rank] if cuda else None)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(1000 + rank)  # this rank's shard of the synthetic data
    for step in range(args.max_iters):
        x = torch.randn(args.batch_size, args.dim, generator=generator).to(device)
        y = x[:, 0]  # a target the net can learn
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
