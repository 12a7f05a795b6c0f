"""Which knobs can share a process, found by test: every candidate timed side by side must compile
exactly the program it compiles alone (its fingerprint), whatever the knobs of its neighbours."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from autocompile.config.spec import ModelSpec, SideBySideSpec, TrialSpec
from autocompile.workload import TargetNode
from tests.conftest import QUICK_ROUNDS, TINY_GPT2, launched, make_spec

AOT = {"compile.backend": "aot_eager"}
# One candidate per knob value the CPU space offers beside the defaults, all in one process.
CANDIDATES: list[dict[str, Any]] = [
    {"compile.scope": "none"},
    {"compile.scope": "module", **AOT},
    {"compile.scope": "module", "compile.fullgraph": True, **AOT},
    {"compile.scope": "module", "compile.optimizer": True, "compile.compiled_autograd": True, **AOT},
    {"compile.scope": "module", "amp.dtype": "bfloat16", "amp.placement": "inside", **AOT},
    {"compile.scope": "regional", "compile.granularity": "sublayer", "compile.rest": "eager", **AOT},
    {"compile.scope": "train_step", "optim.impl": "foreach", **AOT},
]


TINY_T5 = ModelSpec(name="t5-tiny", target="autocompile.workload.families.t5",
                    kwargs={"num_layers": 1, "d_model": 16, "d_ff": 32, "num_heads": 2, "d_kv": 8, "vocab_size": 64})


def seq2seq(knobs: dict[str, Any]) -> TrialSpec:
    """A tiny T5 on source and target tokens of two lengths (16 and 8), as the suite's t5-tiny (128 and 32)."""
    spec = make_spec(knobs, model=TINY_T5)
    data = TargetNode(_target_="autocompile.workload.kinds.SyntheticSeq2Seq", target_len=8)  # type: ignore[typeddict-unknown-key]
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, data=data))


def fingerprints_alone_and_together(tmp_path: Path, candidates: list[dict[str, Any]],
                                    spec_of: Any = None) -> tuple[list, list]:
    specs = [spec_of(k) if spec_of else make_spec(k, model=TINY_GPT2) for k in candidates]
    alone = [launched(tmp_path / f"alone{i}", spec) for i, spec in enumerate(specs)]
    assert all(r["status"] == "ok" for r in alone), [(r.get("failure"), r.get("reason")) for r in alone]
    spec = SideBySideSpec(specs, [f"c{i}" for i in range(len(specs))], expected=[r["fingerprint"] for r in alone],
                          policy=QUICK_ROUNDS)
    together = launched(tmp_path / "together", spec)
    assert together["status"] == "ok", together
    return alone, together["candidates"]



@pytest.mark.integration
def test_every_knob_of_the_cpu_space_compiles_its_own_program_beside_the_others(tmp_path: Path) -> None:
    alone, together = fingerprints_alone_and_together(tmp_path, CANDIDATES)
    for knobs, a, t in zip(CANDIDATES, alone, together, strict=True):
        assert t["status"] == "ok", (knobs, t.get("failure"), t.get("reason"))
        assert t["fingerprint"] == a["fingerprint"], knobs
        assert t["compiled"] == a["compiled"], knobs
    assert len({t["fingerprint"] for t in together}) >= 6  # (fullgraph without a break is module's program)


@pytest.mark.integration
def test_a_candidate_warmed_up_after_another_compiles_its_own_program_on_the_shared_batches(tmp_path: Path) -> None:
    # T5: the regional candidate's graphs note the source and target lengths dynamic on the input ids every
    # candidate trains on (torch 2.13's propagated dynamic dims); the module candidate warmed up after it compiled a
    # graph symbolic in the target length unless the worker forgets those notes first (shape_state).
    candidates = [{"compile.scope": "regional", **AOT}, {"compile.scope": "module", **AOT}]
    alone, together = fingerprints_alone_and_together(tmp_path, candidates, seq2seq)
    assert [(t["status"], t["fingerprint"]) for t in together] == [("ok", a["fingerprint"]) for a in alone]


@pytest.mark.integration
def test_regional_with_block_checkpointing_compiles_another_program_beside_another_compiled_candidate(
        tmp_path: Path) -> None:
    # Its checkpoint wrapper is one code object for every candidate: beside eager it is its own program,
    # beside another compiled candidate (even an identical one) it is not, and the check says so.
    wrapped = {"compile.scope": "regional", "ac.policy": "block", **AOT}
    specs = [make_spec(k, model=TINY_GPT2) for k in ({"compile.scope": "module", **AOT}, wrapped)]
    alone = [launched(tmp_path / f"alone{i}", spec) for i, spec in enumerate(specs)]
    spec = SideBySideSpec(specs, ["module", "wrapped"], expected=[r["fingerprint"] for r in alone],
                          policy=QUICK_ROUNDS)
    module, beside = launched(tmp_path / "together", spec)["candidates"]
    assert module["status"] == "ok" and beside["failure"] == "not_same_program"
    assert alone[1]["fingerprint"] in beside["reason"]


@pytest.mark.integration
def test_inductor_modes_and_options_stay_with_their_candidate(tmp_path: Path) -> None:
    # Inductor's settings are part of every FX-graph cache key: one leaking into a neighbour's compile
    # would change that neighbour's fingerprint.
    candidates = [{"compile.scope": "module"},
                  {"compile.scope": "module", "compile.mode": "max-autotune-no-cudagraphs"},
                  {"compile.scope": "module", "compile.options.shape_padding": False}]
    alone, together = fingerprints_alone_and_together(tmp_path, candidates)
    assert [t["fingerprint"] for t in together] == [a["fingerprint"] for a in alone]
    assert len({a["fingerprint"] for a in alone}) == 3


@pytest.mark.integration
def test_ddp_reducers_each_run_their_own_program_on_two_ranks(tmp_path: Path) -> None:
    # optimize_ddp is the one process-global setting a knob sets: patched around each candidate's calls.
    candidates = [{"compile.scope": "module", "ddp.optimize": "ddp_optimizer", **AOT},
                  {"compile.scope": "module", "ddp.optimize": "python_reducer", "compile.compiled_autograd": True,
                   **AOT},
                  {"compile.scope": "module", "ddp.wrap_order": "compile_of_ddp", **AOT}]
    specs = [make_spec(k, model=TINY_GPT2, nproc=2) for k in candidates]
    alone = [launched(tmp_path / f"alone{i}", spec) for i, spec in enumerate(specs)]
    assert all(r["status"] == "ok" for r in alone), [(r.get("failure"), r.get("reason")) for r in alone]
    spec = SideBySideSpec(specs, ["ddp_optimizer", "python_reducer", "compile_of_ddp"],
                          expected=[r["fingerprint"] for r in alone], policy=QUICK_ROUNDS)
    together = launched(tmp_path / "together", spec)
    assert together["status"] == "ok", together
    assert [c["status"] for c in together["candidates"]] == ["ok"] * 3, together["candidates"]
    assert len({len(c["step_s_windows"]) for c in together["candidates"]}) == 1  # ranks agreed on every round
