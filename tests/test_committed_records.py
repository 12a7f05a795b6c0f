"""Every record committed under ``benchmarks/`` loads with today's readers (issue 34): the worker's results in
the GPU checks through :class:`TrialResult` (nothing lost on the way back to JSON), a study's ``summary.json``
through :class:`Measurement` and the multirun table, the tables of programs through the replay's loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autocompile.report.multirun import print_multirun_summary
from autocompile.study.records.record import Measurement
from autocompile.study.replay import load_table
from autocompile.trial.timing.result import TrialResult

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "benchmarks").rglob("*.json"))


def said(mapping: dict) -> dict:
    return {k: v for k, v in mapping.items() if v is not None}


def test_there_are_records_of_every_kind() -> None:
    names = {p.name for p in RECORDS}
    assert "summary.json" in names and any(n.startswith("gpu_check") for n in names)
    assert any(p.parent.name == "tables" for p in RECORDS)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_committed_record_loads(path: Path, tmp_path: Path) -> None:
    data = json.loads(path.read_text())
    if path.name.startswith("gpu_check"):
        results = [row["result"] for row in data.get("bench") or [] if row.get("result")]
        for raw in results:
            result = TrialResult.from_json(raw)
            assert result.status in ("ok", "failed")
            assert said(result.to_json()) == said(raw)  # every key kept, unknown ones in extra
            assert Measurement.from_dict(raw).ok == (result.status == "ok")
    elif path.name == "summary.json":
        assert Measurement.from_dict(data["best"]["result"]).ok
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "summary.json").write_text(path.read_text())
        print_multirun_summary(tmp_path)  # the table a multirun prints from each job's summary.json
    elif path.name == "result.json" and path.parent.parent.name == "phases":
        # A side-by-side process's windows and wall, kept for benchmarks/recipes/processes_and_windows.py.
        assert data["wall_s"] > 0 and len(data["candidates"]) >= 2
        assert len({len(c["step_s_windows"]) for c in data["candidates"]}) == 1  # one window each per round
        assert (path.parent / "progress.jsonl").is_file()
    elif path.name.startswith("lease_aa_paired"):  # benchmarks/recipes/lease_aa_paired.py: window by window
        summary = data["summary"]
        assert summary["rounds"] == len(data["rows"]) >= 2
        for which in ("windows", "first_window"):
            for arm in ("alone2", "paused", "beside"):
                assert summary[which][arm]["low"] <= summary[which][arm]["ratio"] <= summary[which][arm]["high"]
    elif path.name.startswith("lease_aa"):  # benchmarks/recipes/lease_aa.py: one candidate alone and beside another
        summary = data["summary"]
        assert summary["repeats"] == len(data["rows"]) >= 2
        for row in data["rows"]:
            assert {"alone", "beside"} <= row.keys() and row["beside"]["a"]["lease"] is not None
        ratio = summary["step_beside_over_alone"]
        assert ratio["low"] <= ratio["ratio"] <= ratio["high"]
    elif path.parent.name == "tables":
        table = load_table(path.with_suffix(".csv"))
        assert len(table) == data["configurations"] and any(row.ok for row in table.values())
    else:
        pytest.fail(f"{path}: no reader knows this record; add one here")


def test_a_failure_carries_only_what_was_set_and_an_ok_result_keeps_its_nulls() -> None:
    failed = TrialResult.failed({"failure": "oom", "reason": "CUDA out of memory"}, 1, {"torch": "2.13"},
                                optimizer_steps=3).to_json()
    assert failed == {"status": "failed", "failure": "oom", "reason": "CUDA out of memory", "rank": 1,
                      "optimizer_steps": 3, "environment": {"torch": "2.13"}}
    ok = TrialResult(step_s=0.01, extra={"wall_s": 4.0}).to_json()
    assert ok["mfu"] is None and "mfu" in ok and "script" not in ok and ok["wall_s"] == 4.0
    with pytest.raises(TypeError):
        TrialResult(**{"step_ms": 10.0})  # a key no field declares is a mistake at the writer, not a new key
