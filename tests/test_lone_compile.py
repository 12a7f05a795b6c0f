"""A compile that shared the machine with processes in flight, priced as a lone run's
(``study.records.lone_compile``)."""

from __future__ import annotations

import pytest

from autocompile.study.records.lone_compile import MIN_LONE, PRIOR_RATE, as_alone, describe, lone_rate
from autocompile.trial.timing.result import TrialResult


def compiled(wall: float, cpu: float, shared: float) -> TrialResult:
    return TrialResult(status="ok", compile_s=wall, compile_cpu_s=cpu,
                       lease={"paused_s": 0.0, "waited_s": 0.1, "shared_compile_s": shared})


def test_a_shared_compile_is_its_cpu_seconds_at_the_rate_of_the_studys_lone_compiles() -> None:
    # Before MIN_LONE lone compiles, the prior rate; then the median of the lone ones (the shared one is no rate).
    assert lone_rate([compiled(20.0, 24.6, 0.0)])[0] == PRIOR_RATE
    lone = [compiled(20.0, 24.6, 0.0), compiled(19.0, 23.0, 1.0), compiled(30.0, 36.0, 0.5)]
    assert MIN_LONE <= 3
    rate, basis = lone_rate([*lone, compiled(26.0, 25.0, 26.0)])
    assert rate == pytest.approx(sorted([24.6 / 20, 23 / 19, 36 / 30])[1]) and "3 lone compiles" in basis
    shared = compiled(26.1, 24.8, 26.0)  # gpt2-tiny's module compile beside a train-step compile, 2-core VM
    as_alone(shared, (rate, basis))
    assert shared.compile_s == pytest.approx(24.8 / rate)
    assert shared.lease is not None and shared.lease["compile_wall_s"] == 26.1
    assert shared.lease["compile_basis"] == basis
    alone = compiled(20.0, 24.6, 1.0)  # shared for 5 % of it: alone, its wall stands
    as_alone(alone, (rate, basis))
    assert alone.compile_s == 20.0 and "compile_wall_s" not in (alone.lease or {})
    said = describe([shared, alone])
    assert said is not None and said.startswith("1 of 2 compiles shared the machine") and basis in said
    assert f"x{26.1 / shared.compile_s:.2f}" in said
    assert describe([alone]) is None
    # An eager program's first steps (0.05 s, all of it beside another process) are no compile to price.
    eager = compiled(0.05, 0.04, 0.05)
    as_alone(eager, (rate, basis))
    assert eager.compile_s == 0.05 and describe([eager]) is None
    priced_to_zero = compiled(2.0, 0.0, 2.0)  # a priced compile of 0 s: described without dividing by it
    as_alone(priced_to_zero, (rate, basis))
    assert priced_to_zero.compile_s == 0.0 and describe([priced_to_zero]) is None
