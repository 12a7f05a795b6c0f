"""What each way of meeting FSDP2 and compile compiles: the four arrangements of issue 18, on two CPU ranks.

    python benchmarks/recipes/fsdp_orders.py            # launches each arrangement under torchrun, prints one table

Arrangements (gpt2-tiny, ``fully_shard`` per block and on the root, five AdamW steps, inductor):
``eager`` (no compile); ``compile_then_shard`` (``block.compile()``, then ``fully_shard``); ``shard_then_compile``
(``fully_shard``, then ``block.compile()``); ``shard_then_compile_model`` (``fully_shard``, then
``torch.compile(model)``). Each runs once with an inductor cache of its own (cold) and once in the issue's
sequence sharing one cache directory. Per run: the graphs dynamo captured (nodes, parameters), frames,
graph breaks, inductor's FX-graph cache hits and misses, and the losses. Functional output only: no timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARRANGEMENTS = ("eager", "compile_then_shard", "shard_then_compile", "shard_then_compile_model")


def worker(arrangement: str) -> None:
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch.distributed.fsdp import fully_shard

    from autocompile.workload.models import gpt2

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=512)
    graphs: list[tuple[int, int]] = []

    def recorder(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append((len(gm.graph.nodes), sum(isinstance(t, torch.nn.Parameter) for t in example_inputs)))
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    def shard() -> None:
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)

    if arrangement == "compile_then_shard":
        for block in model.transformer.h:
            block.compile(backend=recorder)
        shard()
    elif arrangement == "shard_then_compile":
        shard()
        for block in model.transformer.h:
            block.compile(backend=recorder)
    elif arrangement == "shard_then_compile_model":
        shard()
        model = torch.compile(model, backend=recorder)
    else:
        shard()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(1 + dist.get_rank()))
    losses = []
    for _ in range(5):
        logits = model(tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 5))
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "graphs": graphs, "frames": counters["frames"]["total"], "breaks": sum(counters["graph_break"].values()),
            "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
            "fx_misses": counters["inductor"]["fxgraph_cache_miss"], "losses": losses}))
    dist.destroy_process_group()


def launch(arrangement: str, cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend",
                          "c10d", "--rdzv-endpoint", "localhost:0", __file__, "--worker", arrangement],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [(a, "own (cold)", launch(a, Path(tmp) / a)) for a in ARRANGEMENTS]
        rows += [(a, "shared, in this order", launch(a, Path(tmp) / "shared")) for a in ARRANGEMENTS[1:]]
    print(f"{'arrangement':<26} {'inductor cache':<22} {'graphs (nodes, params)':<34} frames breaks fx hit/miss")
    for arrangement, cache, r in rows:
        print(f"{arrangement:<26} {cache:<22} {r['graphs']!s:<34} {r['frames']:>6} {r['breaks']:>6} "
              f"{r['fx_hits']:>3}/{r['fx_misses']}")
    losses = {json.dumps(r["losses"]) for _, _, r in rows}
    print(f"losses of every run: {'equal' if len(losses) == 1 else 'DIFFER'} {rows[0][2]['losses']}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
