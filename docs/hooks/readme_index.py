"""mkdocs hook: the site's front page is the README, its links rewritten for the site (pages under docs/ are
linked without the ``docs/`` prefix; a file outside docs/ becomes plain code), so the two never drift."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

LINK = re.compile(r"\[([^\]]+)\]\(([^)#]+)(#[^)]*)?\)")


def site_text(readme: str) -> str:
    def rewrite(m: re.Match[str]) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if target.startswith(("http://", "https://")):
            return m.group(0)
        if target.startswith("docs/"):
            return f"[{text}]({target[len('docs/'):]}{anchor})"
        return text if text.startswith("`") else f"`{target}`"

    return LINK.sub(rewrite, readme)


def on_files(files: Files, config: Any) -> Files:
    readme = Path(config["config_file_path"]).parent / "README.md"
    files.append(File.generated(config, "index.md", content=site_text(readme.read_text())))
    return files
