"""One timing core: every timed process (a model trial, a side-by-side process, a script's process alone or side by
side) schedules its windows with :class:`~autocompile.trial.timing.rounds.Rounds` and times them with one clock, so
the same compile injected at the same step is handled by the same rule in each: its window dropped and counted as
re-warm, and a third compiled window fails the candidate as ``compile_in_timed_part``."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autocompile.config.spec import SideBySideSpec, TrialSpec
from autocompile.config.window_policy import REWARM_WINDOWS, WindowPolicy
from autocompile.trial.timing.rounds import Rounds, Window
from autocompile.workload import TargetNode
from tests.conftest import QUICK_ROUNDS, launched, make_spec, tiny_lm
from tests.test_script import run

KNOBS = {"compile.scope": "module", "compile.backend": "aot_eager"}
ONCE, THRICE = (3,), (3, 7, 10)
"""Steps the batches change at (each change a recompile): in the first timed window of each driver (trial and
script: windows of steps 2-3, 4-5, ...; side by side, a settle step before each: 3-4, 6-7, 9-10, ...), or in
three of them."""


def policy(**kw: Any) -> WindowPolicy:
    return WindowPolicy(**{"window_steps": 2, "min_rounds": 3, "precision": 0.0, "max_timed_s": 10.0, **kw})


def test_a_compiled_window_drops_its_round_for_every_candidate_and_a_third_fails_it() -> None:
    rounds = Rounds([0, 1], policy(), shift=1, side_by_side=True)
    assert rounds.next_round() == [1, 0] and rounds.next_round() == [0, 1]  # rotated by round and shift
    assert rounds.record({0: Window(1.0, 1.0), 1: Window(2.0, 2.0, compiled=True)}) == []
    a, b = rounds.of[0], rounds.of[1]
    assert a.step_s == b.step_s == [] and a.rewarm_steps == b.rewarm_steps == 2 and rounds.timed == 3.0
    for _ in range(REWARM_WINDOWS - 1):
        assert rounds.record({0: Window(1.0, 1.0), 1: Window(2.0, 2.0, compiled=True)}) == []
    assert rounds.record({0: Window(1.0, 1.0), 1: Window(2.0, 2.0, compiled=True)}) == [1]
    assert rounds.live == [0] and not rounds.more()  # side by side, one candidate left: nothing to compare


def test_a_descheduled_round_does_not_count_towards_the_side_by_side_minimum() -> None:
    rounds = Rounds([0, 1], policy(), side_by_side=True)
    for cpu in (0.1, 0.1, 0.01, 0.1):  # the third round: wall without CPU, the process was not running
        assert rounds.more()
        rounds.next_round()
        rounds.record({0: Window(0.1, cpu), 1: Window(0.1, 0.1)})
    assert rounds.clean() == 3 and not rounds.more()  # precision 0: exactly the minimum of clean rounds
    alone = Rounds([0], policy())
    for cpu in (0.1, 0.1, 0.01):  # alone, every window counts: a trial times as many as it is asked
        alone.next_round()
        alone.record({0: Window(0.1, cpu)})
    assert not alone.more()


def test_the_stopping_rule_alone_and_side_by_side() -> None:
    alone = Rounds([0], policy(precision=0.05, min_rounds=2))
    for s in (0.10, 0.10):
        alone.next_round()
        alone.record({0: Window(s, s)})
    assert not alone.more()  # identical windows: the interval is within 5 % at once
    wide = Rounds([0, 1], policy(precision=0.001, min_rounds=2, max_timed_s=1.0), side_by_side=True)
    for a, b in ((0.10, 0.20), (0.10, 0.25), (0.10, 0.21)):
        wide.next_round()
        wide.record({0: Window(a, a), 1: Window(b, b)})
    assert wide.half_width() > 0.001 and wide.more()
    wide.record({0: Window(0.5, 0.5), 1: Window(0.5, 0.5)})
    assert wide.timed >= 1.0 and not wide.more()  # max_timed_s spent


def growing(grow_at: tuple[int, ...]) -> TrialSpec:
    spec = make_spec(KNOBS, model=tiny_lm())
    data = TargetNode(_target_="tests.parts.changing_batches", change_at=list(grow_at))  # type: ignore[typeddict-unknown-key]
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, data=data),
                               measure=dataclasses.replace(spec.measure, windows=3))


SCRIPT = """
import torch

model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(60):
    changes = sum(i >= g for g in GROW_AT)  # longer, then a larger batch, then one more dimension: each recompiles
    x = torch.randn(4 + (changes >= 2), 8 + 4 * (changes >= 1), 16)
    model(x.unsqueeze(0) if changes >= 3 else x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def script_trial(tmp_path: Path, grow_at: tuple[int, ...]) -> dict[str, Any]:
    from autocompile.config.spec import MeasureSettings

    path = tmp_path / "grow.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("GROW_AT", repr(grow_at)))
    measure = MeasureSettings(warmup_steps=2, windows=3, window_steps=2, precision=0.0)
    return run(tmp_path, path, "", KNOBS, measure=measure)


def side_by_side(tmp_path: Path, grow_at: tuple[int, ...]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = growing(grow_at)
    together = SideBySideSpec([spec, spec], ["a", "b"], policy=dataclasses.replace(QUICK_ROUNDS, min_rounds=3))
    out = tmp_path / "together"
    result = launched(out, together)
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    return result, [e for e in events if e["event"] == "round"]


def test_one_compile_in_the_timed_part_is_dropped_alike_by_every_driver(tmp_path: Path) -> None:
    trial = launched(tmp_path / "trial", growing(ONCE))
    assert trial["status"] == "ok", trial.get("reason")
    assert trial["rewarm_steps"] == 2 and trial["windows"] == 3  # its window re-timed, the minimum kept
    script = script_trial(tmp_path, ONCE)
    assert script["status"] == "ok", script.get("reason")
    assert script["rewarm_steps"] == 2 and script["windows"] == 3
    result, rounds = side_by_side(tmp_path, ONCE)
    assert all(c["status"] == "ok" for c in result["candidates"]), result
    assert len(rounds) == result["rounds"] + 1  # one round dropped for both candidates


@pytest.mark.integration
def test_a_third_compiled_window_fails_the_candidate_in_every_driver(tmp_path: Path) -> None:
    trial = launched(tmp_path / "trial", growing(THRICE))
    assert trial["failure"] == "compile_in_timed_part", trial
    script = script_trial(tmp_path, THRICE)
    assert script["failure"] == "compile_in_timed_part", script
    result, _ = side_by_side(tmp_path, THRICE)
    assert [c["failure"] for c in result["candidates"]] == ["compile_in_timed_part"] * 2, result


def script_side_by_side(tmp_path: Path, grow_at: tuple[int, ...]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Two candidates side by side in one process of the script: the same driver of windows as a script alone
    (warm-ups in turn, steps 0-1 and 2-3; then rounds of a settle step and a two-step window each: 4 | 5-6, 7 | 8-9,
    ...)."""
    from autocompile.config.script_settings import ScriptRotation
    from autocompile.config.spec import MeasureSettings
    from tests.test_script import script_spec

    path = tmp_path / "grow_together.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("GROW_AT", repr(grow_at)))
    spec = script_spec(path, "", KNOBS, measure=MeasureSettings(warmup_steps=2, windows=3, window_steps=2))
    spec.rotation = ScriptRotation(knobs=[spec.knobs, spec.knobs], labels=["a", "b"], expected=[None, None],
                                   artifacts=[None, None], policy=dataclasses.replace(QUICK_ROUNDS, min_rounds=3))
    out = tmp_path / "script_together"
    result = launched(out, spec)
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    return result, [e for e in events if e["event"] == "round"]


def test_a_scripts_side_by_side_process_drops_a_compiled_round_with_the_same_driver(tmp_path: Path) -> None:
    # The shapes change at step 5, in the first candidate's first window; the second compiles them in its
    # untimed settle step: one round dropped, for both.
    result, rounds = script_side_by_side(tmp_path, (5,))
    assert [c["status"] for c in result["candidates"]] == ["ok", "ok"], result
    assert len(rounds) == result["rounds"] + 1 and result["rounds"] >= 3
