"""Load autocompile's torchtitan exports with the installed torchtitan's own config code and print what it read.

    python scripts/torchtitan_load.py DIR [DIR ...]

Each DIR holds a study's exports (``best_config.torchtitan.toml``, ``best_config_torchtitan.py``). The torchtitan
on this interpreter decides which one it reads: a release that has ``torchtitan.config.job_config`` (0.2.2 and
older) loads the TOML with ``ConfigManager().parse_args(["--job.config_file", ...])``; one from PR #2386 on loads
the Python config function with ``ConfigManager().parse_args(["--module", "best_config_torchtitan", "--config",
"autocompile_best"])``, and the command line the export prints that overrides a shipped config function instead
(``"command"``). Prints one JSON object per DIR (the format, the compile, activation-checkpointing,
parallelism, training and optimizer fields torchtitan holds), one a line. Needs only torchtitan and its imports.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Any


def toml_format() -> bool:
    return importlib.util.find_spec("torchtitan.config.job_config") is not None


def override_args(export: Path) -> list[str]:
    """The arguments after ``-m torchtitan.train`` of the export's command line for a shipped config function."""
    line = next(line for line in export.read_text().splitlines()
                if "-m torchtitan.train --module" in line and "best_config_torchtitan" not in line)
    return shlex.split(line.split("-m torchtitan.train", 1)[1])


def load(directory: Path) -> dict[str, Any]:
    """What torchtitan's own ConfigManager reads from the export its release takes."""
    if toml_format():
        return fields(["--job.config_file", str(directory / "best_config.torchtitan.toml")]) | {"format": "toml"}
    sys.path.insert(0, str(directory))
    sys.modules.pop("best_config_torchtitan", None)
    try:
        loaded = fields(["--module", "best_config_torchtitan", "--config", "autocompile_best"])
    finally:
        sys.path.remove(str(directory))
    command = fields(override_args(directory / "best_config_torchtitan.py"))
    return loaded | {"format": "python", "command": command}


def fields(args: list[str]) -> dict[str, Any]:
    from torchtitan.config import ConfigManager

    if toml_format():
        config = ConfigManager().parse_args(args)
        ac = config.activation_checkpoint.mode
        training = {"local_batch_size": config.training.local_batch_size, "seq_len": config.training.seq_len}
    else:
        config = ConfigManager().parse_args(args)
        checkpointing = config.activation_checkpoint
        ac = "none" if checkpointing is None else type(checkpointing).__qualname__.split(".")[0].removesuffix("AC")
        ac = {"Full": "full", "Selective": "selective", "MemoryBudget": "memory_budget"}.get(ac, ac)
        training = {"num_tokens_per_microbatch_per_dp_rank": config.training.num_tokens_per_microbatch_per_dp_rank,
                    "max_context_length": config.training.max_context_length}
    parallelism = config.parallelism
    return {
        "compile": {"enable": config.compile.enable, "components": list(config.compile.components),
                    "backend": config.compile.backend},
        "activation_checkpoint": ac,
        "parallelism": {"data_parallel_replicate_degree": parallelism.data_parallel_replicate_degree,
                        "data_parallel_shard_degree": parallelism.data_parallel_shard_degree,
                        "fsdp_reshard_after_forward": parallelism.fsdp_reshard_after_forward},
        "training": {**training, "mixed_precision_param": config.training.mixed_precision_param,
                     "max_norm": config.training.max_norm},
        "optimizer_implementation": config.optimizer.implementation,
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps({"dir": arg, **load(Path(arg))}), flush=True)
