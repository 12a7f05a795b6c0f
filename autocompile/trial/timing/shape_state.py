"""Dynamo's automatic-dynamic memory in a side-by-side process: which dimensions each code object has seen
change, kept per code object for the whole process (``torch._dynamo.pgo``'s code state, torch 2.6+), and which
dimensions compiled graphs noted dynamic on the tensors they returned (:func:`forget_propagated_dims`, torch 2.13+).

A candidate warmed up beside others must start from the memory it had at that point in its own process, or it
compiles another program than alone (the fingerprint check's ``NotSameProgram``). On the model path the
warm-up is the first thing a process runs, so that memory is empty (:func:`fresh_shape_state`). A script may
run work before its first training step (nanoGPT evaluates at step 0), and in the script's own process that
work shapes the training graphs: its token embedding (2-D ids) and position embedding (1-D positions) share
``nn.Embedding.forward``'s frame, the evaluation's rank change marks the frame dynamic, and the first training
graph of the token embedding is symbolic. Beside, that evaluation ran under another candidate's variant. So
the cold run saves its memory at its first training forward (:func:`save_shape_state`) and the side-by-side
process loads it when that candidate's warm-up begins (:func:`load_shape_state`). Torch's private module: where
it is missing or differs, the memory is only forgotten, and the fingerprint check stays the guard.
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

from autocompile.config.torch_private import dynamo_pgo

log = logging.getLogger(__name__)

SHAPE_STATE_FILE = "shape_state.pkl"
"""A cold script run's automatic-dynamic memory at its first training forward, in its trial directory."""


def fresh_shape_state() -> None:
    """Forget which dimensions dynamo has seen change, as a fresh process has (T5's blocks at the encoder's and
    the decoder's lengths warmed after another candidate would compile dynamic graphs from the start)."""
    try:
        pgo = dynamo_pgo()
    except ImportError:
        return
    pgo.reset_code_state()


PROPAGATED = "_dynamo_propagated_dynamic_indices"
"""Where torch (2.13+) notes on a compiled graph's output tensor which dimensions were symbolic in that graph, for
the next graph the tensor enters to start from (AOTAutograd's ``mark_dynamo_propagated_dynamic_indices``; not
guarded on). An output that aliases an input notes it on the input: the staged batches every candidate of a
side-by-side process trains on."""


def forget_propagated_dims(tensors: Iterable[torch.Tensor]) -> None:
    """Forget what compiled graphs noted on ``tensors`` (:data:`PROPAGATED`). Found on T5
    (``benchmarks/results/cpu-2core/suite/issue35_t5-tiny_d597590_interrupted.txt``): the regional candidate's graphs
    noted the source and target lengths dynamic on the shared input ids, and the module candidate warmed up after
    it compiled a graph symbolic in the target length, another program than alone (``NotSameProgram``: six of ten
    verdict candidates, then the winner, and the phase fell back to fresh processes). Alone, nothing else wrote
    on its batches before its warm-up; beside, this makes it so."""
    for t in tensors:
        if hasattr(t, PROPAGATED):
            delattr(t, PROPAGATED)


def save_shape_state(path: Path, models: Iterable[nn.Module]) -> bool:
    """Write this process's automatic-dynamic memory to ``path``; False (and nothing written) where torch keeps
    none that can be read. A frame torch wraps (a unit whose forward is torch's own: ``nn.Embedding``) is keyed
    by ``hash()`` of the code it closes over, which differs from process to process: it is written by that
    code's name, found among the forwards of ``models``, and a frame closing over anything else is left out."""
    try:
        pgo = dynamo_pgo()
        names = _forward_codes(models)
        entries = []
        for code_id, state in pgo.get_code_state().items():
            closure = code_id.closure_hash
            if closure is not None and closure not in names:
                continue
            entries.append((code_id.filename, code_id.firstlineno, code_id.name, code_id.file_hash,
                            None if closure is None else names[closure], state))
        data = pickle.dumps(entries)
    except (ImportError, AttributeError, TypeError, pickle.PicklingError) as e:  # another torch may keep it otherwise
        log.debug("automatic-dynamic memory not saved: %s", e)
        return False
    path.write_bytes(data)
    return True


def load_shape_state(path: str | None, models: Iterable[nn.Module]) -> None:
    """Start from the memory saved at ``path`` (forgotten first; None or unreadable: forgotten only), each
    wrapped frame keyed again by this process's ``hash()`` of the forward it closes over."""
    fresh_shape_state()
    if not path or not Path(path).is_file():
        return
    try:
        pgo = dynamo_pgo()
        local = {name: closure for closure, name in _forward_codes(models).items()}
        state = pgo.get_code_state()
        for filename, firstlineno, name, file_hash, closure_name, code_state in pickle.loads(Path(path).read_bytes()):
            if closure_name is not None and closure_name not in local:
                continue
            closure = None if closure_name is None else local[closure_name]
            state[pgo.CodeId(filename, firstlineno, name, file_hash, closure)] = code_state
        pgo._INIT_CODE_STATE = copy.deepcopy(state)
    except (ImportError, AttributeError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        fresh_shape_state()
        log.warning("automatic-dynamic memory of the cold run not loaded (%s): the candidate starts fresh", e)


def _forward_codes(models: Iterable[nn.Module]) -> dict[int, tuple[str, int, str]]:
    """``hash()`` of a one-cell closure over each submodule's class ``forward`` (what torch's wrapper frame
    closes over: ``pgo.CodeId.make``), by the code's file, line and qualified name."""
    codes = {}
    for model in models:
        for module in model.modules():
            code = getattr(type(module).forward, "__code__", None)
            if code is not None:
                codes[hash((code,))] = (code.co_filename, code.co_firstlineno, code.co_qualname)
    return codes
