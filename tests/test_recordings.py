"""Issue 27: what a CUDA-graph trial counts as compile work, and what it must leave alone so that the winner's
compiled code is found again in the user's process. CPU-runnable halves of findings 4, 13 and 16; the GPU
halves are in tests/test_cuda.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

from autocompile.trial.program.build import warmup_steps
from autocompile.trial.timing.recordings import compile_events, cudagraph_recordings
from tests.conftest import make_spec

PACKAGE = Path(__file__).resolve().parent.parent / "autocompile"


def test_cuda_graph_recordings_are_counted_through_dynamos_recording_callback() -> None:
    """Finding 4: every recording (a first one, one per new shape, a re-record after a static input moved) runs
    inside ``install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING)``; a dynamo compile is another trigger."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    # The call site the counter relies on (torch/_inductor/cudagraph_trees.py record_function).
    assert "CallbackTrigger.CUDAGRAPH_RECORDING" in inspect.getsource(CUDAGraphTreeManager.record_function)
    before = cudagraph_recordings()
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
        pass
    assert cudagraph_recordings() == before + 1
    torch._dynamo.reset()  # drops dynamo's callbacks: the next read installs the counter again
    assert cudagraph_recordings() == before + 1
    torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))  # a DYNAMO trigger: no recording
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "1/0"):
        pass
    assert cudagraph_recordings() == before + 2


def test_a_fullgraph_recompile_is_compile_work_though_dynamos_frame_counter_misses_it() -> None:
    """torch 2.13 counts no frame for a ``fullgraph=True`` compile: a recompile of a new shape in a timed window (a
    script's smaller last batch of an epoch) was timed as steady state. The compile callbacks see it."""
    from autocompile.config.torch_private import counters

    model = torch.nn.Linear(4, 4)
    step = torch.compile(model.forward, fullgraph=True, backend="eager")
    events = compile_events()
    step(torch.randn(2, 4)).sum().backward()
    first = compile_events()
    assert first > events
    step(torch.randn(2, 4)).sum().backward()
    assert compile_events() == first  # the steady state: nothing compiled
    frames = counters()["frames"]["total"]
    step(torch.randn(3, 4)).sum().backward()  # a new shape: a recompile
    assert compile_events() > first
    print(f"\nframes counted by dynamo for the fullgraph recompile: {counters()['frames']['total'] - frames}")


def test_the_cudagraph_error_flag_is_part_of_inductors_cache_key_and_nothing_sets_such_a_flag() -> None:
    """Finding 13: inductor hashes its whole config into the FX-graph cache key (torch/_inductor/codecache.py
    FxGraphHashDetails: ``config.save_config_portable``), ``triton.cudagraph_or_error`` included. A trial that set
    it compiled under another key than the user's process, whose cache lookups of the winner's artifacts then
    missed. No module of autocompile may assign an inductor config (skips are read from inductor's counter)."""
    from torch._inductor import config as inductor_config

    key = inductor_config.save_config_portable(ignore_private_configs=False)
    assert "triton.cudagraph_or_error" in key
    with inductor_config.patch({"triton.cudagraph_or_error": not key["triton.cudagraph_or_error"]}):
        assert inductor_config.save_config_portable(ignore_private_configs=False) != key

    assigned = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and "_inductor.config" in ast.unparse(target):
                    assigned.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(target)}")
    assert not assigned


def test_warm_up_covers_the_cuda_graph_recording_of_every_shape_under_automatic_dynamic() -> None:
    """Finding 16: step i trains on shape i % n. Automatic dynamic compiles a static graph for the first shape,
    then a dynamic one at step 1 that meets the first shape at step n; a CUDA graph tree warms each (graph, shape)
    up on its first call and records it on its second (torch/_inductor/cudagraph_trees.py cudagraphify_impl's
    fn_cache per int key; CUDAGraphTreeManager._run: run_eager until the function is warmed up). So the first
    shape is recorded at step 2n: the warm-up must hold steps 0..2n."""
    for lengths in ([16, 32], [16, 24, 32], [8, 16, 24, 32]):
        assert warmup_steps(make_spec({}, seq_len=lengths)) >= 2 * len(lengths) + 1
    assert warmup_steps(make_spec({}, seq_len=[16])) == 2  # one shape: first call warms up, second records
