"""The documentation: reference pages match the code, every link resolves inside the repository, the site
builds, and the README stays a five-minute read."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autocompile.config import docpages as reference
from autocompile.config.knobs import KNOBS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_reference_pages_are_what_the_code_writes_now() -> None:
    assert reference.stale(ROOT / "docs" / "reference") == [], "run: python -m autocompile.config.docpages"


def test_a_knob_changed_without_its_page_makes_the_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, default = KNOBS["compile.mode"]
    monkeypatch.setitem(KNOBS, "compile.mode", (dataclasses.replace(spec, doc="Another doc."), default))
    assert reference.stale(ROOT / "docs" / "reference") == ["knobs.md"]
    assert "Another doc." in reference.knobs_page()


def test_every_setting_has_a_docstring_on_its_page() -> None:
    rows = [line for line in reference.settings_page().splitlines() if line.startswith("| `")]
    assert len(rows) > 50
    assert all(not line.endswith("|  |") for line in rows), [line for line in rows if line.endswith("|  |")]
    assert any(line.startswith("| `compare.processes` | `7` |") for line in rows)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text and "/work/" not in text, "a page cites a file outside the repository"
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name}: link to {target} does not resolve"
        assert ROOT in path.parents, f"{page.name}: link to {target} leaves the repository"


def test_the_readme_is_a_five_minute_read() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs-material is in the dev extra")
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                                          "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Your first study" in (tmp_path / "index.html").read_text()
