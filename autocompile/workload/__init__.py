"""The user's training job: model, data, loss, optimizer and schedule, built from their ``_target_`` paths."""

from __future__ import annotations

from typing import TypedDict


class TargetNode(TypedDict, total=False):
    """A Hydra-style part node (``workload.data``, ``.loss``, ``.optimizer``, ``.lr_schedule``): the keys beside
    these two are keyword arguments of the target, any the target takes (``lr: 3e-4``), passed on verbatim
    (``parts.split`` reads them). Standard library only: ``config.spec`` declares the workload with it."""

    _target_: str | None
    """Dotted path of the class or function (``torch.optim.AdamW``); None only for ``lr_schedule``: a constant
    learning rate."""
    _partial_: bool
    """Hydra's ``_partial_``: absent means a class is built once and a function is the part itself."""
