"""The winner for torchtitan in both of its config formats: ``best_config.torchtitan.toml`` for torchtitan 0.2.2 and
older, ``best_config_torchtitan.py`` (a config function returning ``Trainer.Config``, and the command line that
overrides a shipped one) for torchtitan from PR #2386 on, each loaded by that torchtitan's own ``ConfigManager`` with
the winner's compile, activation-checkpointing and parallelism settings found in it.

torchtitan is not a dependency: the loading test runs with each interpreter that has it, this one if it does and those
named in ``AUTOCOMPILE_TORCHTITAN_PYTHONS`` (``os.pathsep``-separated; ``scripts/torchtitan_exports.sh`` makes one
per pinned commit), and skips where none has it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autocompile.report.export.gaps import Winner
from autocompile.report.export.titan_python import TITAN_PYTHON_COMMIT, python_gaps, torchtitan_python
from autocompile.report.export.torchtitan import TORCHTITAN_RELEASE, torchtitan_toml
from tests.test_frameworks import WINNERS, gap_knobs

LOADER = Path(__file__).resolve().parents[1] / "scripts" / "torchtitan_load.py"


def interpreters() -> list[str]:
    found = [sys.executable] if importlib.util.find_spec("torchtitan") is not None else []
    return found + [p for p in os.environ.get("AUTOCOMPILE_TORCHTITAN_PYTHONS", "").split(os.pathsep) if p]


def write_exports(w: Winner, directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "best_config.torchtitan.toml").write_text(torchtitan_toml(w))
    (directory / "best_config_torchtitan.py").write_text(torchtitan_python(w))
    return directory


def expected(w: Winner) -> dict[str, Any]:
    """What torchtitan must hold for the winner, in either format."""
    shard = w.strategy == "fsdp2"
    return {"compile": w.compiled, "activation_checkpoint": "full" if w.knob("ac.policy") == "block" else "none",
            "data_parallel_replicate_degree": w.world_size if w.strategy == "ddp" else 1,
            "data_parallel_shard_degree": w.world_size if shard else 1}


def check(loaded: dict[str, Any], w: Winner) -> None:
    want = expected(w)
    assert loaded["compile"]["enable"] is want["compile"]
    if want["compile"]:
        assert loaded["compile"]["components"] == ["model"] and loaded["compile"]["backend"] == "inductor"
    assert loaded["activation_checkpoint"] == want["activation_checkpoint"]
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree"):
        assert loaded["parallelism"][key] == want[key], key
    if w.strategy == "fsdp2":
        assert loaded["parallelism"]["fsdp_reshard_after_forward"] == "never"  # the winner's reshard_after_forward
    assert loaded["training"]["max_norm"] == 1.0


def test_the_python_export_is_a_config_function_that_sets_the_winners_fields() -> None:
    source = torchtitan_python(WINNERS["fsdp2"])
    tree = ast.parse(source)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert function.name == "autocompile_best"
    assigned = {ast.unparse(n.targets[0]): ast.unparse(n.value) for n in function.body if isinstance(n, ast.Assign)}
    assert assigned["config.compile"] == "CompileConfig(enable=True, components=['model'], backend='inductor')"
    assert assigned["config.activation_checkpoint"] == "FullAC.Config()"
    assert assigned["config.parallelism.data_parallel_shard_degree"] == "2"
    assert assigned["config.parallelism.fsdp_reshard_after_forward"] == "'never'"
    assert assigned["config.training.num_tokens_per_microbatch_per_dp_rank"] == "128"  # batch 4 x 32 tokens
    assert "activation-checkpoint:full" in source and source.index("activation-checkpoint:full") > source.index(
        "--optimizer.implementation")  # a tyro subcommand comes last
    assert TITAN_PYTHON_COMMIT[:9] in source and "best_config.torchtitan.toml" in source
    # Which releases read which file, in each.
    assert f"torchtitan {TORCHTITAN_RELEASE} and older" in torchtitan_toml(WINNERS["eager"])
    assert "best_config_torchtitan.py" in torchtitan_toml(WINNERS["eager"])
    assert "no release reads them yet" in source


def test_both_exports_list_what_torchtitan_cannot_express() -> None:
    ddp = torchtitan_python(WINNERS["ddp"])
    assert "not_expressible" in ddp and "not_expressible" in torchtitan_toml(WINNERS["ddp"])
    # Today's torchtitan has no DDP and no autocast: the gaps say so where the TOML release had them.
    assert {"compile.scope", "compile.optimizer", "compile.compiled_autograd", "ddp.optimize", "ddp.wrap_order"} <= (
        gap_knobs(python_gaps(WINNERS["ddp"])))
    assert "amp.dtype" in gap_knobs(python_gaps(WINNERS["regional_ac_bf16"]))
    assert python_gaps(WINNERS["eager"]) == []
    assert "Everything the winner sets is expressed below." in torchtitan_python(WINNERS["eager"])


@pytest.mark.parametrize("python", interpreters() or [pytest.param(None, marks=pytest.mark.skip(
    reason="torchtitan is not installed (scripts/torchtitan_exports.sh makes interpreters that have it)"))])
def test_torchtitans_own_config_code_loads_the_export_its_release_reads(python: str, tmp_path: Path) -> None:
    dirs = {name: write_exports(w, tmp_path / name) for name, w in WINNERS.items()}
    run = subprocess.run([python, str(LOADER), *map(str, dirs.values())], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = {Path(r["dir"]).name: r for r in map(json.loads, run.stdout.splitlines())}
    assert set(loaded) == set(WINNERS)
    for name, w in WINNERS.items():
        check(loaded[name], w)
        if loaded[name]["format"] == "python":
            check(loaded[name]["command"], w)  # the command line over a shipped config function, too
        else:
            assert loaded[name]["training"]["local_batch_size"] == 4 and loaded[name]["training"]["seq_len"] == 32
