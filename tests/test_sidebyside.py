"""Candidates timed side by side in one process: each runs its own program, windows are paired within
rounds, the interval widens when processes disagree, and what cannot share a process falls back."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autocompile.config.knobs import Env
from autocompile.config.settings import ObjectiveSettings
from autocompile.config.spec import SideBySideSpec
from autocompile.study.phases.confirmation import confirmed
from autocompile.study.phases.racing import study_noise
from autocompile.study.records.objective import Objective
from autocompile.study.statistics.intervals import Paired, break_even, paired_windows, time_to_train
from autocompile.trial.timing.result import TrialResult
from tests.conftest import QUICK_ROUNDS, launched, make_spec, tiny_lm

EAGER = {"compile.scope": "none"}
MODULE = {"compile.scope": "module", "compile.backend": "aot_eager"}
REGIONAL = {"compile.scope": "regional", "compile.backend": "aot_eager"}


def side_by_side(tmp_path: Path, knobs: list[dict], *, model=None, expected=None, **kw) -> dict:
    model = model or tiny_lm()
    spec = SideBySideSpec([make_spec(k, model=model) for k in knobs], [f"c{i}" for i in range(len(knobs))],
                          expected=expected or [], policy=dataclasses.replace(QUICK_ROUNDS, **{"min_rounds": 4, **kw}))
    return launched(tmp_path / "sbs", spec)


@pytest.mark.integration
def test_each_candidate_runs_its_own_program_with_identical_weights_and_rounds_stay_aligned(tmp_path: Path) -> None:
    alone = {name: launched(tmp_path / name, make_spec(k, model=tiny_lm()))
             for name, k in (("module", MODULE), ("regional", REGIONAL))}
    result = side_by_side(tmp_path, [EAGER, MODULE, REGIONAL],
                          expected=[None, alone["module"]["fingerprint"], alone["regional"]["fingerprint"]])
    assert result["status"] == "ok", result
    eager, module, regional = result["candidates"]
    assert [c["status"] for c in result["candidates"]] == ["ok"] * 3, result["candidates"]
    # Beside the others each compiled exactly what it compiles alone (the check would fail it otherwise).
    assert module["fingerprint"] == alone["module"]["fingerprint"]
    assert regional["fingerprint"] == alone["regional"]["fingerprint"]
    assert module["compiled"] == ["model"] and "blocks.0" in regional["compiled"] and eager["compiled"] == []
    assert module["compiled_coverage"] == 1.0 and regional["compiled_coverage"] == 1.0
    # One window per candidate per round: the rounds pair.
    counts = {len(c["step_s_windows"]) for c in result["candidates"]}
    assert len(counts) == 1 and counts.pop() >= 4
    # Same seed, same batches: the three programs train identically (the eager step is the reference).
    for c in (module, regional):
        assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(c["losses"], eager["losses"], strict=True))


def test_a_candidate_that_compiles_another_program_beside_the_others_fails_saying_so(tmp_path: Path) -> None:
    result = side_by_side(tmp_path, [EAGER, MODULE], expected=[None, "0123456789abcdef"])
    eager, module = result["candidates"]
    assert eager["status"] == "ok" and module["status"] == "failed"
    assert module["failure"] == "not_same_program" and "0123456789abcdef" in module["reason"]


def test_pairing_tells_a_certainly_slower_candidate_apart(tmp_path: Path) -> None:
    # The sleeping model sleeps 20x longer per block under autocast: certainly slower.
    model = tiny_lm()
    model.kwargs["block_sleep_s"] = 0.001
    result = side_by_side(tmp_path, [EAGER, {**EAGER, "amp.dtype": "bfloat16"}], model=model)
    fast, slow = (c["step_s_windows"] for c in result["candidates"])
    # Each window's process CPU seconds beside it (per step): what tells a descheduled window from a slow one.
    assert all(len(c["step_cpu_s_windows"]) == len(c["step_s_windows"]) for c in result["candidates"])
    ratio = paired_windows({0: fast}, {0: slow})
    assert ratio is not None and ratio.low is not None and ratio.low > 1.0  # more than twice as slow
    assert ratio.basis == "one process" and ratio.processes == 1 and ratio.process_p is None


def test_processes_that_disagree_widen_the_interval() -> None:
    rng = random.Random(0)

    def windows(offset: float) -> list[float]:
        return [math.exp(offset + rng.gauss(0, 0.01)) for _ in range(30)]

    base = {p: windows(0.0) for p in range(4)}
    agree = paired_windows(base, {p: windows(0.02) for p in range(4)})
    # The same mean effect, but each process favours the candidate differently (+-4%).
    disagree = paired_windows(base, {p: windows(0.02 + s) for p, s in enumerate((-0.04, 0.04, -0.04, 0.04))})
    assert agree is not None and disagree is not None
    assert disagree.basis == "process means" and disagree.process_p < 0.01  # the F test sees the process effect
    assert agree.low > 0  # 2% is measurable when the processes agree
    assert (disagree.high - disagree.low) > 4 * (agree.high - agree.low)
    assert disagree.low < 0 < disagree.high  # and not when they disagree by more than that


def test_time_to_train_carries_the_cold_compile_spread_and_break_even_is_stated() -> None:
    step = paired_windows({0: [0.010] * 10 + [0.0101] * 10}, {0: [0.0097] * 10 + [0.0098] * 10})
    assert step is not None and step.high < 0
    # A faster step with a longer compile: the time to train over a short horizon is uncertain.
    short = time_to_train(step, (0.010, 2.0), (0.0097, 20.0), horizon=1000, compile_cv=0.15)
    long = time_to_train(step, (0.010, 2.0), (0.0097, 20.0), horizon=1_000_000, compile_cv=0.15)
    assert short.change > 0 and long.change < 0  # 18 s more compile pays back only over a long job
    assert (short.high - short.low) > (long.high - long.low)
    text = break_even(step, (0.010, 2.0), (0.0097, 20.0), ("eager", "compiled"))
    assert text is not None and text.startswith("compiled: steps 3.0% faster, compile +18 s")
    assert "pays back after" in text
    assert break_even(step, (0.010, 20.0), (0.0097, 2.0)) is None  # faster and compiles sooner: nothing to pay
    assert break_even(step, (0.010, 0.01), (0.0097, 0.04)) is None  # two eager programs: no compile to pay back
    slower = paired_windows({0: [0.0097] * 10 + [0.0098] * 10}, {0: [0.010] * 10 + [0.0101] * 10})
    assert break_even(slower, (0.0097, 20.0), (0.010, 2.0), ("compiled", "eager")).startswith("compiled: steps")


def sbs_study(windows: dict[str, list[list[float]]]) -> optuna.Study:
    """A study whose confirmation phase ran side by side: per label, its windows in each process."""
    study = optuna.create_study(directions=["minimize"])
    study.set_user_attr("method.confirm", {"method": "side_by_side", "why": ""})
    configs = {"eager": {"compile.scope": "none"}, "compile": {"compile.scope": "module"}}
    for number, (label, per_process) in enumerate(windows.items()):
        for r, w in enumerate(per_process):
            step = math.exp(statistics.fmean(map(math.log, w)))
            study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[step], user_attrs={
                "phase": "confirm", "round": r, "label": f"#{number}", "method": "side_by_side",
                "result": {"status": "ok", "step_s": step, "step_s_windows": w, "compile_s": 0.0},
                "identity": label, "constraints": {}, "candidate": number, "config": configs[label], "name": label,
                "baseline": label, "compile_s_cold": 0.0}))
    return study


def test_a_confirmation_side_by_side_pairs_windows_and_its_noise_floor_pools_only_repeats() -> None:
    rng = random.Random(1)

    def process(level: float, step: float) -> list[float]:  # one process: its own speed, window noise 2%
        return [step * level * math.exp(rng.gauss(0, 0.02)) for _ in range(40)]

    levels = [1.0, 1.15, 0.9]  # processes differ by 15%, which pairing cancels
    study = sbs_study({"eager": [process(v, 0.0103) for v in levels], "compile": [process(v, 0.0100) for v in levels]})
    outcome = confirmed(study, Objective(ObjectiveSettings(kind="throughput")))
    assert outcome is not None
    gain = outcome.gains["eager"].step  # the winner (compile) against eager
    assert isinstance(gain, Paired) and gain.low is not None and gain.high is not None
    assert outcome.method["method"] == "side_by_side" and gain.processes == 3 and gain.rounds == 120
    assert gain.high - gain.low < 0.03  # a 3% effect, measured to about +-1% despite 15% between processes
    noise = study_noise(study, "side_by_side")
    assert noise is not None and noise.df == 4 and noise.rel_sd > 0.05  # across processes: the 15%, as it is
    assert "side by side" in noise.source and "reference is not pooled" in noise.source
    assert study_noise(study) is None  # no alone repeat: the components stay apart


def test_one_cache_per_process_holds_every_candidates_cold_cache_once(tmp_path: Path) -> None:
    from autocompile.config.knobs import TrialConfig
    from autocompile.study.phases.sidebyside import Member, merge_caches

    env = Env.detect("cpu", 1, False)
    config = TrialConfig.from_flat({}, env)
    for name, entry in (("a", "fxgraph/ab/key1"), ("b", "fxgraph/cd/key2")):
        (tmp_path / name / "inductor_cache" / entry).parent.mkdir(parents=True)
        (tmp_path / name / "inductor_cache" / entry).write_text(name)
    members = [Member("a", config, TrialResult(trial_dir=str(tmp_path / "a"))),
               Member("a again", config, TrialResult(trial_dir=str(tmp_path / "a"))),  # an A/A comparison
               Member("b", config, TrialResult(trial_dir=str(tmp_path / "b"))), Member("eager", config, TrialResult())]
    cache = tmp_path / "process0" / "inductor_cache"
    assert merge_caches(members, cache) == {"a", "a again", "b"}
    assert (cache / "fxgraph/ab/key1").read_text() == "a" and (cache / "fxgraph/cd/key2").read_text() == "b"
    assert (cache / "fxgraph/ab/key1").stat().st_ino == (tmp_path / "a/inductor_cache/fxgraph/ab/key1").stat().st_ino


def test_a_stalled_window_drops_its_round_instead_of_widening_every_interval() -> None:
    rng = random.Random(2)
    a = {p: [0.010 * math.exp(rng.gauss(0, 0.02)) for _ in range(30)] for p in range(3)}
    b = {p: [0.0103 * math.exp(rng.gauss(0, 0.02)) for _ in range(30)] for p in range(3)}
    clean = paired_windows(a, b)
    b[1][7] *= 30  # another job took the cores for one window (seen on the 2-core VM)
    a[2][3] *= 5
    stalled = paired_windows(a, b)
    assert clean is not None and stalled is not None and clean.dropped == 0 and stalled.dropped == 2
    assert stalled.rounds == clean.rounds - 2
    assert abs(stalled.change - clean.change) < 0.005 and stalled.low > 0  # +3% still measured


def test_regional_with_block_checkpointing_does_not_share_a_process_with_another_compiled_candidate() -> None:
    from autocompile.config.knobs import TrialConfig
    from autocompile.study.phases.sidebyside import Member, cannot_share

    env = Env.detect("cpu", 1, False)

    def member(label: str, knobs: dict) -> Member:
        return Member(label, TrialConfig.from_flat(knobs, env), TrialResult(peak_memory_bytes=1))

    wrapped = member("wrapped", {"compile.scope": "regional", "ac.policy": "block"})
    settings = type("S", (), {"device": "cpu"})()
    assert cannot_share([member("eager", {"compile.scope": "none"}), wrapped], settings) is None
    why = cannot_share([member("module", {"compile.scope": "module"}), wrapped], settings)
    assert why is not None and why.startswith("wrapped compile(s) per-block checkpoint wrappers")


def test_a_candidate_left_alone_beside_failed_neighbours_is_told_not_timed() -> None:
    # What the side-by-side worker returned in the FSDP2 verdict phase (regional winner, two neighbours that
    # compiled other programs beside it): the winner was ready, but no round had two candidates to time.
    from autocompile.study.phases import sidebyside as study_sidebyside
    from autocompile.study.phases.together import failure

    result = TrialResult.from_json({"status": "ok", "candidates": [
        {"label": "winner", "status": "ok", "fingerprint": "7ce5", "step_s": None, "step_s_windows": []},
        {"label": "fsdp.reshard_after_forward=False", "status": "failed", "failure": "not_same_program",
         "reason": "NotSameProgram: compiled program 452e beside the other candidates"},
        {"label": "fsdp.mp_policy=bf16", "status": "failed", "failure": "recompile_limit",
         "reason": "FailOnRecompileLimitHit: Hard failure due to fail_on_recompile_limit_hit"}]})
    shared = study_sidebyside.not_shared([result])
    assert result.candidates is not None
    winner, neighbour, _ = (failure(c, result, shared) for c in result.candidates)
    assert winner is not None and winner.failure == "not_timed" and "not_same_program" in (winner.reason or "")
    assert neighbour is not None and (neighbour.failure, neighbour.reason) == (
        "not_same_program", result.candidates[1].reason)
    timed = dataclasses.replace(result.candidates[0], step_s=0.02, step_s_windows=[0.02, 0.02])
    assert failure(timed, result, shared) is None
    killed = failure(timed, TrialResult(status="failed", failure="timeout", reason="killed"), shared)
    assert killed is not None and (killed.failure, killed.reason) == ("timeout", "killed")


@pytest.mark.parametrize("programs", [1, 12])
def test_candidates_sharing_a_process_each_get_the_recompile_budget_they_would_have_alone(programs: int) -> None:
    """Twelve compiled verdict neighbours share the model's code objects; dynamo's limit (8 entries per code
    object) failed the ninth with FailOnRecompileLimitHit beside the others, never alone."""
    import torch
    from torch._dynamo.exc import FailOnRecompileLimitHit

    from autocompile.trial.program.build import start_process

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    def backend(i: int):  # a distinct program per candidate: its own cache entry on step's code object
        return lambda gm, _: gm.forward

    threads = torch.get_num_threads()
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256,
                                        fail_on_recompile_limit_hit=False):
            start_process(threads, torch.device("cpu"), 1, programs=programs)
            compiled = [torch.compile(step, backend=backend(i)) for i in range(12)]
            if programs == 1:
                for fn in compiled[:8]:
                    fn(torch.ones(3))
                with pytest.raises(FailOnRecompileLimitHit):
                    compiled[8](torch.ones(3))
            else:
                assert all(torch.equal(fn(torch.ones(3)), torch.full((3,), 3.0)) for fn in compiled)
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(threads)


@pytest.mark.integration
def test_blocks_run_at_two_lengths_compile_beside_each_other_as_they_do_alone(tmp_path: Path) -> None:
    """The suite's T5 study could not time any compiled candidate side by side (NotSameProgram): its blocks run at
    the encoder's and the decoder's lengths, the first candidate's second length made dynamo's automatic-dynamic
    state for their code "dynamic", and every later candidate compiled dynamic graphs from the start where alone
    it compiled a static one first. Each candidate's warm-up now starts from a fresh shape state."""
    model = tiny_lm("two_lengths")
    fullgraph = {**REGIONAL, "compile.fullgraph": True}
    alone = [launched(tmp_path / f"alone{i}", make_spec(k, model=model))["fingerprint"]
             for i, k in enumerate((REGIONAL, fullgraph))]
    result = side_by_side(tmp_path, [REGIONAL, fullgraph], model=model, expected=alone)
    assert [c["status"] for c in result["candidates"]] == ["ok", "ok"], result["candidates"]
    assert [c["fingerprint"] for c in result["candidates"]] == alone
