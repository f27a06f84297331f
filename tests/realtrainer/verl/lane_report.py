"""Reading an inner pytest run of a real-trainer lane: each param's outcome, its failure
report and the metrics of its mismatch table."""

from __future__ import annotations

import re

import pytest


def outcome(result: pytest.RunResult, test: str, param: str) -> str | None:
    """PASSED / FAILED / ERROR of ``test[param]`` in a ``-rA`` summary."""
    pattern = re.compile(rf"^(PASSED|FAILED|ERROR) \S*{test}\[{re.escape(param)}\]")
    for line in result.outlines:
        match = pattern.match(line)
        if match:
            return match.group(1)
    return None


def section(result: pytest.RunResult, test: str, param: str) -> list[str]:
    """The failure report of ``test[param]`` (its ``___ title ___`` section)."""
    lines, inside = [], False
    for line in result.outlines:
        if re.match(r"^_{3,} .* _{3,}$", line):
            inside = f"{test}[{param}]" in line
            continue
        if re.match(r"^={3,} ", line):
            inside = False
        if inside:
            lines.append(line)
    return lines


def mismatched(report: list[str]) -> set[str]:
    """Metrics in the rows of the mismatch table (``metric  step  expected  actual ...``)."""
    rows = (re.match(r"^\s*(\S+)\s+\d+\s+-?[\d.]", line) for line in report)
    return {row.group(1) for row in rows if row}


def verdict_problems(
    result: pytest.RunResult, test: str, same_math: list[str], must_fail: dict[str, str]
) -> list[str]:
    """What is wrong with the replay of ``test``: a same-math param that did not pass, a
    param of ``must_fail`` that did not fail, or failed without its metric in the table."""
    problems = []
    for param in same_math:
        verdict = outcome(result, test, param)
        if verdict != "PASSED":
            report = "\n    ".join(section(result, test, param)[-25:])
            problems.append(f"same-math [{param}] must pass, got {verdict}:\n    {report}")
    for param, metric in must_fail.items():
        verdict = outcome(result, test, param)
        report = section(result, test, param)
        if verdict != "FAILED":
            problems.append(f"[{param}] must fail on {metric}, got {verdict}")
        elif metric not in mismatched(report):
            shown = "\n    ".join(report[-25:])
            problems.append(f"[{param}] failed, but not on {metric}:\n    {shown}")
    return problems
