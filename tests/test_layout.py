"""The package's layout: subpackages named for the flow, no import cycle between modules, modules that fit on a screen
or few. Read from the source with ``ast`` (nothing is imported), so it runs in well under a second."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autocompile"
SUBPACKAGES = ("config", "workload", "trial", "study", "report")
TOP_LEVEL = {"__init__", "__main__", "app"}
MAX_LINES = 400  # a module fits on a few screens; knobs.py splits its declarations by group


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """The autocompile modules ``name`` imports, at the top or inside functions: ``from pkg import mod`` counts as
    importing ``pkg.mod`` when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {target for target in found if target in MODULES and target != name}


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (its first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_top_level_and_function_level_imports() -> None:
    assert "autocompile.workload.units" in GRAPH["autocompile.config.settings"]  # at the top
    assert "autocompile.study.tuner" in GRAPH["autocompile.app"]  # inside main(), lazily
    assert "autocompile.workload.units" in GRAPH["autocompile.trial.program.apply_parts"]  # from ... import units
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def subpackage(module: str) -> str:
    """``config``, ``study``... for a module of a subpackage; the module's own name at the top level."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else module


def test_no_two_subpackages_import_each_other() -> None:
    """The flow reads one way (config -> workload -> trial -> study -> report), function-level imports included:
    the study notifies observers instead of calling report code."""
    between = {(subpackage(a), subpackage(b)) for a, targets in GRAPH.items() for b in targets
               if subpackage(a) != subpackage(b)}
    assert {(a, b) for a, b in between if (b, a) in between and a in SUBPACKAGES and b in SUBPACKAGES} == set()
    sub_graph = {sub: {b for a, b in between if a == sub and b in SUBPACKAGES} for sub in SUBPACKAGES}
    assert find_cycle(sub_graph) is None, "cycle between subpackages: " + " -> ".join(find_cycle(sub_graph) or [])


def test_every_module_is_short() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def folder(module: str) -> str:
    """The folder a module sits in, as a path under ``autocompile/`` (``study/phases``; ``""`` at the top)."""
    relative = MODULES[module].parent.relative_to(PACKAGE).as_posix()
    return "" if relative == "." else relative


FOLDERS = sorted({folder(m) for m in MODULES} | {
    p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"})


def test_no_cycle_between_folders_sub_folders_included() -> None:
    """A folder's own modules may import its sub-folders, never the reverse: every arrow points down or across,
    and no two folders import each other (``study/phases`` -> ``study`` would run back up)."""
    graph: dict[str, set[str]] = {f: set() for f in FOLDERS}
    for a, targets in GRAPH.items():
        for b in targets:
            if folder(a) != folder(b):
                graph[folder(a)].add(folder(b))
    assert find_cycle(graph) is None, "cycle between folders: " + " -> ".join(find_cycle(graph) or [])
    up = {(a, b) for a, bs in graph.items() for b in bs if a.startswith(f"{b}/") or (b == "" and a)}
    assert up == set(), f"imports running back up to a parent folder: {sorted(up)}"


def test_no_folder_over_fifteen_modules_and_no_two_modules_share_a_name() -> None:
    sizes = {f: len([p for p in (PACKAGE / f).glob("*.py") if p.name != "__init__.py"]) for f in FOLDERS}
    assert {f: n for f, n in sizes.items() if n > 15} == {}
    stems: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            stems.setdefault(path.stem, []).append(path.relative_to(PACKAGE).as_posix())
    assert {s: ps for s, ps in stems.items() if len(ps) > 1} == {}
    assert not {"shared", "utils", "misc", "helpers", "common"} & set(stems)


def test_docs_layout_names_every_folder_and_module() -> None:
    """docs/layout.md's table against the tree: a row per folder naming exactly its modules, none stale."""
    rows = {}
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("/`"):
            name = cells[0].strip("`").rstrip("/")
            rows["" if name == "autocompile" else name] = {m.strip() for m in cells[2].split(",") if m.strip()}
    tree = {f: {p.stem for p in (PACKAGE / f).glob("*.py")} - {"__init__", "__main__"} for f in FOLDERS}
    assert rows == tree


def test_subpackages_hold_everything_but_the_command_line() -> None:
    for sub in [f for f in FOLDERS if f]:
        init = PACKAGE / sub / "__init__.py"
        assert init.is_file(), f"autocompile/{sub}/ is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"autocompile/{sub}/__init__.py says what it is for"
        assert len(list((PACKAGE / sub).glob("*.py"))) > 1, f"autocompile/{sub}/ holds no module"
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(SUBPACKAGES)
    assert not list(PACKAGE.rglob("*.py.tmpmove"))


def test_the_wheel_lists_every_subpackage() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["packages"]) == {"autocompile", "autocompile.conf",
                                           *(f"autocompile.{sub.replace('/', '.')}" for sub in FOLDERS if sub)}
