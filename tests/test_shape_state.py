"""A candidate beside others starts from the automatic-dynamic memory of its own process at its first training
step (``trial/timing/shape_state``): nanoGPT's evaluation at step 0 runs its token (2-D ids) and position (1-D)
embeddings through one frame (here also at another batch size), which in the script's own process makes the first
training graph of the token embedding symbolic; beside, that evaluation ran under another candidate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

# One process each (as a cold run and a side-by-side process are): torch wraps nn.Embedding.forward in a frame
# keyed by hash() of that code, which differs between processes.
PROGRAM = """
import sys, types, torch
from torch import nn
from autocompile.trial.timing.shape_state import load_shape_state, save_shape_state
from pathlib import Path

torch.manual_seed(0)
model = nn.ModuleDict({"wte": nn.Embedding(64, 8), "wpe": nn.Embedding(16, 8)})
shapes = []

def backend(gm, inputs):  # each placeholder's shape as dynamo traced it (a symbol where dynamic)
    values = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    shapes.append([tuple(str(d) for d in v.shape) for v in values if isinstance(v, torch.Tensor)])
    return gm.forward

for unit in model.values():  # as regional compiles a unit whose forward is torch's (apply_parts._compile_forward)
    unit.forward = types.MethodType(torch.compile(type(unit).forward, backend=backend), unit)
ids, pos = torch.randint(0, 64, (2, 16)), torch.arange(16)
eval_ids = torch.randint(0, 64, (4, 16))
mode, path = sys.argv[1], Path(sys.argv[2])
if mode == "cold":
    with torch.no_grad():  # the evaluation at step 0
        model["wte"](eval_ids), model["wpe"](pos)
    assert save_shape_state(path, [model])
elif mode == "beside":
    load_shape_state(str(path), [model])
shapes.clear()
model["wte"](ids).sum().backward()  # the first training step
print(shapes[0])
"""


def run(mode: str, path: Path) -> str:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_candidate_beside_others_compiles_the_graph_its_evaluation_made_dynamic_alone(tmp_path: Path) -> None:
    state = tmp_path / "shape_state.pkl"
    alone = run("cold", state)
    assert re.fullmatch(r"\[\('64', '8'\), \('s\d+', 's\d+'\)\]", alone)  # the ids symbolic alone
    assert run("beside", state) == alone  # the cold run's memory, keyed again in this process
    assert run("fresh", state) == "[('64', '8'), ('2', '16')]"  # without it: static, another program
