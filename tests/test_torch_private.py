"""The private torch names autocompile relies on (torch has no public API for them) are where it expects them, and
only :mod:`autocompile.config.torch_private` reaches them: this fails, naming the torch version, on a torch that
moves one, before a trial would (the shape of ``tests/test_optuna_private.py``)."""

from __future__ import annotations

import ast
import importlib

import torch

from autocompile.config import torch_private
from tests.conftest import ROOT

PACKAGE = ROOT / "autocompile"


def test_every_private_name_exists_in_this_torch() -> None:
    missing = []
    for name in torch_private.REQUIRED:
        try:
            torch_private.resolve(name)
        except (ImportError, AttributeError, KeyError) as exc:
            missing.append(f"{name} ({type(exc).__name__})")
    assert missing == [], f"torch {torch.__version__} moved: {', '.join(missing)}"
    for logger in torch_private.LOGGERS.values():
        importlib.import_module(logger)  # a logger's name is its module's


def test_the_optional_names_are_read_where_this_torch_has_them() -> None:
    """Torch 2.11 to 2.15 keep them; an older one lacks some, and the readings that need them say so."""
    found = []
    for name in torch_private.OPTIONAL:
        try:
            torch_private.resolve(name)
            found.append(name)
        except (ImportError, AttributeError, KeyError):
            pass
    lacking = set(torch_private.OPTIONAL) - set(found)
    assert not lacking, f"torch {torch.__version__} lacks {lacking}"


def private_uses(tree: ast.AST) -> list[str]:
    """``torch._x`` attributes, ``from torch._x import``/``from torch.y import _z``, and ``._compiled_call_impl``."""
    uses = []
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id == "torch" and any(p.startswith("_") and not p.startswith("__")
                                                                         for p in chain):
                uses.append(".".join(["torch", *reversed(chain)]))
            elif node.attr == "_compiled_call_impl":
                uses.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            if any(p.startswith("_") for p in node.module.split(".")) or any(a.name.startswith("_")
                                                                               for a in node.names):
                uses.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            uses += [a.name for a in node.names if a.name.startswith("torch._")]
    return uses


def test_no_module_but_torch_private_reaches_a_private_torch_name() -> None:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "torch_private.py":
            continue
        uses = private_uses(ast.parse(path.read_text()))
        if uses:
            found[path.relative_to(ROOT).as_posix()] = uses
    assert found == {}


def test_the_scan_sees_each_kind_of_private_use() -> None:
    code = ("import torch._dynamo\nfrom torch._dynamo import pgo\nfrom torch.utils.data.dataloader import _Base\n"
            "torch._dynamo.config.x = 1\nm._compiled_call_impl = f\n")
    assert len(private_uses(ast.parse(code))) == 5
