"""The README's worked example of adding a knob: ``compile.options.size_asserts``, one field of the knob
table's ``InductorOptions``. Declared there, it is validated, sampled in the extended space, passed to
``torch.compile`` merged over the mode's options, logged, and changes the compiled program."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autocompile.config.knobs import KNOBS, Env, KnobError, TrialConfig
from autocompile.config.space import SearchSpace
from autocompile.trial.program.graphs import listening, verify
from autocompile.trial.program.step import apply, compile_kwargs, lm_loss
from autocompile.workload.data import SyntheticTokens
from tests.test_programs import VOCAB, tiny_gpt2

KEY = "compile.options.size_asserts"


def cpu_env() -> Env:
    return Env.detect("cpu", 1, False)


def test_the_knob_is_declared_once_and_offered_only_where_it_acts() -> None:
    spec, default = KNOBS[KEY]
    assert default is None and spec.extended  # None: the mode's own setting
    env = cpu_env()
    assert SearchSpace(env, {}, extended=True).options(KEY, {"compile.scope": "module", "compile.backend": "inductor"}
                                                       ) == (None, True, False)
    assert SearchSpace(env, {}).options(KEY, {"compile.scope": "module", "compile.backend": "inductor"}) == (None,)
    with pytest.raises(KnobError, match=r"compile\.backend is inductor"):
        TrialConfig.from_flat({"compile.backend": "aot_eager", KEY: False}, env)


def test_it_reaches_torch_compile_merged_over_the_modes_options() -> None:
    from torch._inductor import list_mode_options

    config = TrialConfig.from_flat({"compile.mode": "max-autotune-no-cudagraphs", KEY: False}, cpu_env())
    kwargs = compile_kwargs(config.compile)
    assert kwargs["options"] == {**list_mode_options("max-autotune-no-cudagraphs"), "size_asserts": False}
    assert "mode" not in kwargs  # torch.compile refuses mode and options together


def inductor_fingerprint(knobs: dict[str, Any]) -> str:
    """As the worker takes it: inductor's cache keys named while the warm-up steps compile."""
    torch._dynamo.reset()
    config = TrialConfig.from_flat({"compile.scope": "module", "compile.backend": "inductor", **knobs}, cpu_env())
    torch.manual_seed(0)
    model = tiny_gpt2()
    step = apply(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lm_loss, config)
    data = SyntheticTokens(VOCAB, 2, [8], seed=0)
    with listening(step.log):
        for i in range(2):
            step(*data.batch(i))
    assert step.log.inductor_keys, "inductor named no cache key"
    return verify(step, model, "module")["fingerprint"]


@pytest.mark.integration
def test_it_changes_the_compiled_program() -> None:
    # Inductor's cache key holds its config: another program, measured apart (not stopped as a copy).
    assert inductor_fingerprint({KEY: True}) != inductor_fingerprint({KEY: False})
