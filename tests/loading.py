"""Load a Python file that is not a package module (a script, a recipe, a generated ``best_config.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(path: Path, name: str | None = None) -> ModuleType:
    """``path`` executed as module ``name`` (its stem by default), registered in ``sys.modules`` so that its
    dataclasses resolve their module by name."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
