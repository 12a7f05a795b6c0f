"""Real trials through the launcher: torchrun, a fresh process per trial, result.json."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from autocompile.config.knobs import Env, KnobError, TrialConfig
from autocompile.trial.timeline import wall_split
from autocompile.trial.timing.result import TrialResult
from tests.conftest import assert_ok, assert_rates, launched, make_spec, run_trials, survivors, tiny_lm

FAST = {"compile.backend": "eager"}


def single_process_matrix() -> list[dict[str, Any]]:
    """Every valid scope x AMP (none / bf16 x placement) x placement.order, each once."""
    env = Env.detect("cpu", 1, False)
    amps = [{"amp.dtype": "none"}, {"amp.dtype": "bfloat16", "amp.placement": "outside"},
            {"amp.dtype": "bfloat16", "amp.placement": "inside"}]
    configs: dict[tuple, dict[str, Any]] = {}
    for scope, amp, order in itertools.product(["none", "module", "regional", "train_step"], amps,
                                               ["to_then_compile", "compile_then_to"]):
        knobs = {"compile.scope": scope, "placement.order": order, **amp, **FAST}
        config = TrialConfig.from_flat(knobs, env, strict=False)  # drops what does not apply
        configs.setdefault(tuple(sorted(config.active(env).items())), config.flat())
    return list(configs.values())


@pytest.mark.integration
def test_every_scope_amp_and_placement_order_runs_ok(tmp_path: Path) -> None:
    configs = single_process_matrix()
    # none x {fp32, bf16}; module and regional x 3 AMP x 2 orders; train_step x 3 AMP.
    assert len(configs) == 2 + 6 + 6 + 3
    results = run_trials(tmp_path, [make_spec(k) for k in configs])
    for knobs, result in zip(configs, results, strict=True):
        assert_ok(result)
        assert bool(result["compiled"]) == (knobs["compile.scope"] != "none")
        assert result["environment"]["world_size"] == 1
        assert set(wall_split(TrialResult.from_json(result))) == {
            "overhead_start_s", "overhead_imports_s", "overhead_build_s", "warmup_s", "waited_s", "timed_s",
            "teardown_s"}
        trial_dir = Path(result["trial_dir"])
        # One process runs its worker with plain python (measure.launcher=auto); the replay line says so.
        assert "-m autocompile.trial.timing.worker" in (trial_dir / "cmd.txt").read_text().splitlines()[0]
        assert json.loads((trial_dir / "trial.json").read_text())["knobs"] == knobs


def ddp_matrix() -> list[dict[str, Any]]:
    env = Env.detect("cpu", 2, False)
    configs = []
    for wrap, ca, mode in itertools.product(("ddp_of_compiled", "compile_of_ddp"), (False, True),
                                            ("ddp_optimizer", "no_optimization", "python_reducer")):
        knobs = {"compile.scope": "module", "ddp.wrap_order": wrap, "compile.compiled_autograd": ca,
                 "ddp.optimize": mode, "compile.backend": "eager"}
        try:
            configs.append(TrialConfig.from_flat(knobs, env).flat())
        except KnobError:
            continue
    return configs


@pytest.mark.integration
def test_ddp_both_wrap_orders_and_every_valid_reducer_keep_ranks_identical(tmp_path: Path) -> None:
    configs = ddp_matrix()
    assert len(configs) == 6  # 2 wrap orders x (ddp_optimizer, no_optimization, python_reducer+compiled autograd)
    results = run_trials(tmp_path, [make_spec(k, nproc=2) for k in configs], parallel=1)
    for knobs, result in zip(configs, results, strict=True):
        assert_ok(result)
        assert result["environment"]["world_size"] == 2
        checksums = result["param_checksums"]
        assert len(checksums) == 2 and checksums[0] == checksums[1], knobs
        wrapped = "DistributedDataParallel(model)" in result["compiled"]
        assert wrapped == (knobs["ddp.wrap_order"] == "compile_of_ddp")


@pytest.mark.integration
def test_one_single_process_and_one_ddp_trial_from_the_matrices_run_ok(tmp_path: Path) -> None:
    # The default run's share of the two matrices above (integration): the least default corner of each.
    single = {"compile.scope": "regional", "amp.dtype": "bfloat16", "amp.placement": "inside",
              "placement.order": "compile_then_to", **FAST}
    ddp = next(k for k in ddp_matrix() if k["ddp.wrap_order"] == "compile_of_ddp" and k["compile.compiled_autograd"])
    single_result, ddp_result = run_trials(tmp_path, [make_spec(single, model=tiny_lm()),
                                                      make_spec(ddp, model=tiny_lm(), nproc=2)], parallel=1)
    assert_ok(single_result)
    assert single_result["compiled_coverage"] == 1.0 and len(single_result["compiled"]) > 2  # blocks and the rest
    assert_ok(ddp_result)
    assert ddp_result["environment"]["world_size"] == 2 and ddp["ddp.optimize"] == "python_reducer"
    checksums = ddp_result["param_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    assert "DistributedDataParallel(model)" in ddp_result["compiled"]


def test_a_trials_throughput_counts_every_rank_every_shape_and_whole_accumulated_steps(tmp_path: Path) -> None:
    """The worker's items against the workload, literally: 2 ranks x batch 2 x sequences of 8 and 16 tokens
    (a mean of 12), accumulating 2 micro-batches per optimizer step. Each window runs whole periods (both
    shapes, whole optimizer steps), so every window's rate is exactly 48 tokens per (micro-)step over its step
    time: a dropped rank or a shape counted twice is a factor, not noise."""
    spec = make_spec({"compile.scope": "none"}, model=tiny_lm(), nproc=2, seq_len=[8, 16])
    spec = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, grad_accum_steps=2))
    result = launched(tmp_path / "trial", spec)
    assert result["status"] == "ok", result.get("reason")
    assert result["environment"]["world_size"] == 2 and result["throughput_unit"] == "tokens"
    assert result["window_steps"] == 2 and result["windows"] == 2  # lcm(2 shapes, 2 micro-batches)
    assert_rates(result, 2 * 2 * (8 + 16) / 2)
    assert_ok(result)  # the same, from the trial's spec


@pytest.mark.integration
def test_losses_of_eager_and_compiled_trials_agree(tmp_path: Path) -> None:
    eager, compiled = run_trials(tmp_path, [make_spec({"compile.scope": "none"}),
                                            make_spec({"compile.scope": "module", "compile.backend": "aot_eager"})])
    assert_ok(eager)
    assert_ok(compiled)
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)


def test_graph_break_under_fullgraph_fails_with_the_reason(tmp_path: Path) -> None:
    spec = make_spec({"compile.scope": "module", "compile.fullgraph": True, **FAST}, model=tiny_lm("graph_break"))
    loose = make_spec({"compile.scope": "module", **FAST}, model=tiny_lm("graph_break"))
    strict, relaxed = run_trials(tmp_path, [spec, loose])
    assert strict["status"] == "failed" and strict["failure"] == "graph_break"
    assert "graph_break()" in strict["reason"]
    assert_ok(relaxed)
    assert relaxed["graph_breaks"] >= 1 and any("graph_break" in r for r in relaxed["graph_break_reasons"])


def test_raising_and_nan_trials_fail_with_their_message(tmp_path: Path) -> None:
    raised, nan = run_trials(tmp_path, [make_spec({"compile.scope": "none"}, model=tiny_lm("raise")),
                                        make_spec({"compile.scope": "none"}, model=tiny_lm("nan"))])
    assert raised["status"] == "failed" and raised["failure"] == "exception"
    assert "ValueError: boom from the test model" in raised["reason"]
    assert nan["status"] == "failed" and nan["failure"] == "nan_loss"


# A two-rank torchrun trial (8-18 s). Default run: a raise's reason in a trial's result,
# test_raising_and_nan_trials_fail_with_their_message; a two-rank trial that fails,
# test_ranks_that_end_with_different_parameters_fail_the_trial; one rank's failure on two ranks,
# tests/test_measure.py::test_ranks_drop_a_candidate_that_failed_on_one_rank_together.
@pytest.mark.integration
def test_failure_on_one_rank_is_reported(tmp_path: Path) -> None:
    result = launched(tmp_path / "t", make_spec({"compile.scope": "none"}, model=tiny_lm("raise"), nproc=2))
    assert result["status"] == "failed"
    assert "boom from the test model" in result["reason"]


def test_ranks_that_end_with_different_parameters_fail_the_trial(tmp_path: Path) -> None:
    result = launched(tmp_path / "t", make_spec({"compile.scope": "none"}, model=tiny_lm("diverge"), nproc=2))
    assert result["status"] == "failed" and result["failure"] == "ranks_diverged", result.get("reason")


def test_peak_flops_are_found_from_device_names() -> None:
    from autocompile.trial.timing.readings import peak_flops

    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12  # the name has no "A100" word without the dashes
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA GeForce RTX 4090") == 0.0  # unknown: MFU left out unless measure.peak_tflops


def test_hanging_trial_is_killed_at_its_timeout_with_nothing_left_alive(tmp_path: Path) -> None:
    spec = make_spec({"compile.scope": "none"}, model=tiny_lm("hang"), nproc=2, timeout_s=5)
    result = launched(tmp_path / "hang", spec)
    assert result["status"] == "failed" and result["failure"] == "timeout"
    assert survivors(str((tmp_path / "hang").resolve())) == []


def test_stop_rule_prunes_a_running_trial(tmp_path: Path) -> None:
    spec = make_spec({"compile.scope": "none"}, model=tiny_lm(), windows=50, window_steps=20)
    seen: list[int] = []

    def stop_after_first_window(events: list[dict[str, Any]], elapsed: float) -> str | None:
        windows = [e for e in events if e["event"] == "window"]
        seen.append(len(windows))
        return "slower than the best after window 1" if windows else None

    result = launched(tmp_path / "p", spec, should_stop=stop_after_first_window)
    assert result["status"] == "pruned" and result["reason"] == "slower than the best after window 1"
    assert max(seen) >= 1


def test_a_failures_reason_is_words_without_a_terminals_codes() -> None:
    from autocompile.trial.timing.readings import classify

    # torch.load's weights_only message bolds its warning (pytorch/examples' time_sequence_prediction/train.py)
    message = "Weights only load failed. \x1b[1mDo those steps only if you trust it\x1b[0m.\nmore"
    failure = classify(RuntimeError(message))
    assert failure["reason"] == "RuntimeError: Weights only load failed. Do those steps only if you trust it. | more"
