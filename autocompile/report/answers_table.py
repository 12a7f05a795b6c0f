"""``python -m autocompile task=answers [tracking.uri=URI | output_root=DIR]``: the answers a tracking store knows
(:mod:`autocompile.study.answers`), newest first, one row each: what a later study of the same job starts from."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from autocompile.report.view import console
from autocompile.study.answers import list_answers


def store_of(argv: list[str]) -> str:
    """The tracking store the command line names: ``tracking.uri``, else ``<output_root>/mlflow.db`` (``runs``)."""
    given = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    return given.get("tracking.uri") or f"sqlite:///{(Path(given.get('output_root', 'runs')) / 'mlflow.db').resolve()}"


def print_answers(argv: list[str]) -> int:
    """Print the store's answers; 0, or 1 when it holds none (the reason said in one line)."""
    uri = store_of(argv)
    answers = list_answers(uri)
    if not answers:
        console().print(f"no answers in {uri}: a study that recommends a configuration keeps one there")
        return 1
    table = Table(title=f"answers in {uri}")
    for column in ("study", "finished", "recommended", "decided", "device", "torch", "key", "related", "source"):
        table.add_column(column)
    for a in answers:
        table.add_row(a.study, a.finished, a.winner_name, "yes" if a.decided else "no", a.fields.get("device", ""),
                      a.fields.get("torch", ""), a.key, a.related, a.source)
    console().print(table)
    return 0
