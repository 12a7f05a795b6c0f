"""What a regional compile hands to ``torch.compile``: the model's repeated stacks and the rest.

Follows Accelerate's ``compile_regions`` (the "regional compilation" its users know): every
``nn.ModuleList`` whose children share one class is a repeated stack and each child is a block;
a module holding a stack somewhere below it is descended into; any other subtree is "the rest"
(embeddings, final norm, head), compiled whole by Accelerate and left eager by ``rest=eager``.
Every stack is found, so encoder and decoder (T5, BART) and both towers (CLIP) are covered, and a
``ModuleList`` of output heads is a stack of its own rather than a rival to the blocks.

Torch only: the worker runs this where nothing else is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn


def is_stack(module: nn.Module) -> bool:
    """A ``ModuleList`` of same-class children (Accelerate's ``is_repeated_blocks``)."""
    return isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(c) for c in module}) == 1


def _holds_stack(module: nn.Module) -> bool:
    return any(is_stack(m) for m in module.modules())


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module, bool]]:
    """(path, module, is_stack) for every stack and every subtree of the rest, Accelerate's recursion."""
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if is_stack(child):
            yield path, child, True
        elif _holds_stack(child):
            yield from _walk(child, f"{path}.")
        else:
            yield path, child, False


def stacks(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """Every repeated stack, outermost only (a stack inside a block belongs to that block)."""
    if is_stack(model):
        return [("", model)]  # type: ignore[list-item]
    return [(path, m) for path, m, stack in _walk(model, "") if stack]  # type: ignore[misc]


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Each block of each stack, by path; raises when there is none (regional needs one)."""
    found = distinct([(f"{path}.{i}" if path else str(i), block) for path, stack in stacks(model)
                      for i, block in enumerate(stack)])
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no nn.ModuleList of same-class blocks; regional compile and "
            "per-block checkpointing need one (use compile.scope=module)")
    return found


def rest(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Subtrees outside every stack that hold parameters: what ``rest=compiled`` compiles.

    Parameter-free leaves (dropout, activations) between them are left to the model's own forward:
    alone they are no graph worth a compile, and nothing could show that they ran compiled. Shared
    and tied modules are compiled where they are called (:func:`where_called`)."""
    if is_stack(model):
        return []
    found = [(path, m) for path, m, stack in _walk(model, "") if not stack and _has_params(m)]
    return where_called(found, [b for _, stack in stacks(model) for b in stack])


def distinct(found: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Each module object once, at its first path: one object in a stack twice (weights shared across
    depth, ``ModuleList([layer] * n)``) is one unit, compiled, checkpointed or sharded once; its compiled
    forward runs at every position, compiling it again would wrap the compiled forward in another."""
    seen: set[int] = set()
    kept = []
    for path, m in found:
        if id(m) not in seen:
            seen.add(id(m))
            kept.append((path, m))
    return kept


def _twin_key(module: nn.Module) -> tuple[type, frozenset[int]]:
    return type(module), frozenset(id(p) for p in module.parameters())


def where_called(found: list[tuple[str, nn.Module]], blocks: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    """``found`` less the paths a shared or tied module is not called under, read from structure alone.

    One module object registered under several paths (T5 in transformers 4: ``shared`` is also
    ``encoder.embed_tokens`` and ``decoder.embed_tokens``) is compiled once: its compiled forward is
    the object's, so a call under any path enters it. Twins, modules of one class holding the same
    parameters (T5 in transformers 5: three ``nn.Embedding`` with one tied weight), are compiled at
    their deepest paths only: a model keeps the shallow one as a handle (``get_input_embeddings``)
    while the sub-model that holds the deeper one calls it; compiling the handle would hand
    ``torch.compile`` a module whose forward never runs. A module whose twin sits inside a block is
    compiled with that block. Tied modules of different classes (an embedding and the head sharing
    its weight) are each called, and each compiled."""
    in_blocks = {_twin_key(m) for b in blocks for m in b.modules() if _has_params(m)}
    deepest: dict[tuple[type, frozenset[int]], int] = {}
    for path, m in found:
        key = _twin_key(m)
        deepest[key] = max(deepest.get(key, 0), path.count("."))
    kept, seen = [], set()
    for path, m in found:
        key = _twin_key(m)
        if key in in_blocks or path.count(".") < deepest[key] or id(m) in seen:
            continue
        seen.add(id(m))
        kept.append((path, m))
    return kept


def sublayers(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """A block's parts compiled on their own: each child that holds parameters (attention, MLP, and
    loose layers such as OPT's ``fc1``/``fc2`` or a bare LayerNorm), so no weight of the block is
    left eager. A group of loose layers cannot be one unit: they are not one callable, and compiling
    the block around them would inline the sublayers."""
    return [(name, child) for name, child in block.named_children() if _has_params(child)]


@dataclass(frozen=True)
class Structure:
    """What the model's shape allows; decided once per study, read by the knob conditions."""

    has_blocks: bool = True
    """The model has a repeated stack (regional compile and per-block checkpointing apply)."""
    splits_blocks: bool = True
    """Its blocks have more than one part holding parameters (sublayer granularity differs from block)."""
    has_rest: bool = True
    """Parameters live outside the stacks (``compile.rest`` can matter)."""
    same_blocks: bool = True
    """Every block has one structure (class, parameter names and shapes): one nested region serves them all."""

    @classmethod
    def of(cls, model: nn.Module) -> Structure:
        found = [b for _, b in stacks_blocks(model)]
        return cls(has_blocks=bool(found), splits_blocks=any(len(sublayers(b)) > 1 for b in found),
                   has_rest=bool(rest(model)), same_blocks=len({block_shape(b) for b in found}) <= 1)


def block_shape(block: nn.Module) -> tuple[Any, ...]:
    """A block's structure: its class and its parameters' names and shapes (ResNet's stages differ in width,
    T5's first block alone holds the relative-position bias)."""
    return (type(block), *((name, tuple(p.shape)) for name, p in block.named_parameters()))


def stacks_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    try:
        return blocks(model)
    except ValueError:
        return []
