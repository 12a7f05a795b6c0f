"""The GPU check's report: the CUDA checks with their tests' outcomes, the table of configurations, the study;
one command's files, or all commands' files merged (``gpu_check.py --merge DIR``). Standard library only."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpu_check_plan import CONFIGS, CUDA_TESTS, STAGE, STAGES, cuda_tests, tests_of


def junit_outcomes(path: Path) -> dict[str, str]:
    """pytest's JUnit XML: each test case (``name[params]``) and passed, failed, error or skipped."""
    if not path.exists():
        return {}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[case.get("name", "?")] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes


def log_outcomes(output: str) -> dict[str, str]:
    """The same from pytest's ``-v`` log (a run stopped at its budget writes no XML): ``name[params]`` -> outcome."""
    found = re.findall(r"(PASSED|FAILED|ERROR|SKIPPED)\s+\S*::(\S+)|\S*::(\S+)\s+(PASSED|FAILED|ERROR|SKIPPED)", output)
    return {(a_name or b_name): (a_kind or b_kind).lower()
            for a_kind, a_name, b_name, b_kind in found}


def check_results(root: Path, outcomes: dict[str, str]) -> list[dict[str, Any]]:
    """Per check of the tests stage: its tests and how they ended ("no test" where the file has none)."""
    tests = cuda_tests(root / CUDA_TESTS)
    rows = []
    for check in STAGE["tests"].checks:
        names = tests_of(check, tests)
        ended = [o for case, o in outcomes.items() if case.split("[")[0] in names]
        counts = {o: ended.count(o) for o in ("passed", "failed", "error", "skipped") if o in ended}
        result = ", ".join(f"{n} {o}" for o, n in counts.items()) if ended else ("not run" if names else "no test")
        rows.append({"finding": check.finding, "what": check.what, "tests": names, "result": result})
    return rows


def describe_row(row: dict[str, Any]) -> str:
    r = row.get("result") or {}
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason', '')}"[:300]
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (f"{r['tokens_per_s']:,.0f} tokens/s{mfu}, compile {r['compile_s']:.1f} s, "
            f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB, wall {r['wall_s']:.0f} s")


def table(rows: list[dict[str, Any]]) -> str:
    head = ("configuration", "status", "tokens/s", "MFU", "compile s", "peak mem GiB", "step ms (CV)", "wall s",
            "cache")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in rows:
        r = row.get("result") or {}
        if row["status"] == "ok":
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
            cells = [f"{r['tokens_per_s']:,.0f}", mfu, f"{r['compile_s']:.1f}",
                     f"{r['peak_memory_bytes'] / 2**30:.2f}", f"{r['step_s'] * 1e3:.1f} ({r['step_s_cv']:.1%})",
                     f"{r['wall_s']:.0f}"]
        else:
            cells = ["-"] * 5 + [f"{r['wall_s']:.0f}" if "wall_s" in r else "-"]
            notes.append(f"- {row['name']}: {row['status']}: {row.get('reason', '')}"[:400])
        lines.append("| " + " | ".join([row["name"], row["status"], *cells, row["cache"]]) + " |")
    return "\n".join(lines + (["", *notes] if notes else []))


def tests_section(tests: dict[str, Any] | None) -> list[str]:
    if not tests:
        return ["not run (stage tests not asked for)"]
    lines = [f"`{tests['command']}`: exit {tests['exit_code']}, {tests['summary']} ({tests['seconds']} s)", "",
             "| finding | check | tests | result |", "|---|---|---|---|"]
    for c in tests.get("checks", []):
        lines.append(f"| {c['finding'] or '-'} | {c['what']} | {', '.join(c['tests']) or '-'} | {c['result']} |")
    return lines


def study_section(study: dict[str, Any] | None) -> str:
    if study and "counts" in study:
        return (f"`{study['command']}`: {study['status']} in {study['seconds']} s; {study['study']}: "
                f"{study['counts']}; stopped: {study['stop_reason']}; best: {study['best']} "
                f"(compiled {study['best_compiled']})")
    if study is None:
        return "not run (stage study not asked for)"
    return f"{study.get('status')}: {study.get('reason', '')} (study.log)"


def report(env: dict[str, Any], args: dict[str, Any], tests: dict[str, Any] | None, rows: list[dict[str, Any]],
           study: dict[str, Any] | None, wall_s: float, commands: list[str]) -> str:
    knobs = "\n".join(
        f"- {r['name']}: `{' '.join(f'{k}={v}' for k, v in {**r['knobs'], **r.get('workload', {})}.items())}`"
        + (f" ({r['note']})" if r["note"] else "") for r in rows)
    rest = [r["name"] for r in rows if r["status"] == "not run"]
    again = [s.name for s in STAGES if any(c.name in rest for c in s.configs)]
    text = [
        f"# gpu_check: {env['device_name']}, torch {env['torch']}",
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in commands),
        "",
        f"{env['date']}; Python {env['python']}; CUDA {env.get('cuda')}; triton {env.get('triton', '-')} "
        f"({env.get('triton_pin', 'pin unknown')}); transformers {env.get('transformers', '-')}; {env['cpus']} CPUs; "
        f"commit {env.get('git_commit') or '-'}; driver/GPU: {env.get('nvidia_smi', '-')}; check {wall_s:.0f} s.",
        "",
        "## CUDA tests",
        "",
        *tests_section(tests),
        "",
        f"## {args['model']}, batch {args['batch_size']} x {args['seq_len']}, one trial per configuration",
        "",
        "Each a fresh torchrun process tree, cold inductor cache unless the cache column says warm; "
        f"{args['windows']} timed windows of {args['window_steps']} steps after the warm-up; tokens/s is the median "
        "window; compile s is the warm-up's time beyond what those steps take at steady state; peak memory is "
        "what the worker reports (CUDA allocator on a GPU, process max RSS on a CPU); MFU against the device's "
        "dense bf16 peak.",
        "",
        table(rows) if rows else "not run (no table stage asked for)",
        "",
        knobs,
    ]
    if rest:
        text += ["", f"Not run for time: `bash scripts/gpu_check.sh --stage {','.join(again)} "
                 f"--only {','.join(rest)} --name rest`"]
    text += ["", "## Study", "", study_section(study)]
    return "\n".join(text) + "\n"


def merge(folder: Path) -> str:
    """One report from every command's ``gpu_check-*.json`` in ``folder`` (written to ``gpu_check.md``)."""
    parts = [json.loads(p.read_text()) for p in sorted(folder.glob("gpu_check-*.json"))]
    if not parts:
        raise SystemExit(f"no gpu_check-*.json in {folder}")
    order = {c.name: i for i, c in enumerate(CONFIGS)}
    rows = sorted((r for p in parts for r in p["bench"]), key=lambda r: order.get(r["name"], len(order)))
    tests = next((p["tests"] for p in parts if p.get("tests")), None)
    study = next((p["study"] for p in parts if p.get("study")), None)
    text = report(parts[0]["environment"], parts[0]["args"], tests, rows, study, sum(p["wall_s"] for p in parts),
                  [p["environment"]["command"] for p in parts])
    (folder / "gpu_check.md").write_text(text)
    return text
