"""A verl 0.7 real-trainer lane as one inner pytest project: running it (record the
references, replay every param), and reading the replay: each param's outcome, its failure
report and the metrics of its mismatch table."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

import pytest

INNER_TEST = """
import sys

import pytest

sys.path.insert(0, {harness_dir!r})
import {harness} as H  # noqa: E402

from pytest_rollout_golden import same_math  # noqa: E402

CASES = same_math(
    {{name: H.ALL_CASES[name] for name in [*H.SAME_MATH, *H.BUGGED]}}, reference=H.REFERENCE
) + same_math(H.TOKEN_MEAN, reference=H.TOKEN_MEAN_REFERENCE)


@pytest.mark.parametrize("case", CASES)
def {test}(golden, case):
    run = H.{run}(dtype=golden.dtype, **case)
    for step in range(H.STEPS):
        batch = golden.rollout(lambda: H.make_batch(step), step=step)
        out = run.step(batch)
        golden.check(out.metrics, step=step)
        golden.check_tensors(
            {tensor!r}, {{{key!r}: out.old_log_prob}}, mask=out.response_mask, step=step
        )
"""


@dataclasses.dataclass(frozen=True)
class Lane:
    """One lane: the harness module and its run class, the inner test's name, the tensor it
    checks (``(name, key)``), the params that must pass and those that must fail (with the
    metric each must fail on), the param and metric that must lead its headline, a
    variant whose per-micro-batch means must be listed as not comparable, and whether the
    lane also runs as the float64 oracle (``--golden-certify``: :func:`certify_problems`)."""

    harness: str
    run: str
    test: str
    tensor: tuple[str, str]
    same_math: list[str]
    must_fail: dict[str, str]
    headline: tuple[str, str]
    not_comparable: str
    certify: bool = False


def run_lane(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, lane: Lane, paths: list[Path]
) -> None:
    """Record the references once (``-k mb8``), replay every variant and bug once, and
    assert each verdict; ``paths`` go first on the inner runs' ``PYTHONPATH``."""
    monkeypatch.delenv("CI", raising=False)
    found = [*map(str, paths), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in found if p))
    pytester.makeini("[pytest]\ngolden_metric_profile = verl\n")
    inner = INNER_TEST.format(
        harness_dir=str(Path(__file__).resolve().parent), harness=lane.harness, run=lane.run,
        test=lane.test, tensor=lane.tensor[0], key=lane.tensor[1],
    )  # fmt: skip
    module = f"{lane.test}_lane"
    pytester.makepyfile(**{module: inner})
    common = ("-p", "no:cacheprovider", "-rA")
    start = time.perf_counter()
    record = pytester.runpytest_subprocess(*common, "--update-golden", "-k", "mb8", timeout=300)
    recorded = time.perf_counter()
    replay = pytester.runpytest_subprocess(*common, timeout=300)
    print(f"record {recorded - start:.1f}s, replay {time.perf_counter() - recorded:.1f}s")
    assert record.parseoutcomes().get("passed") == 2, "\n".join(record.outlines)

    problems = verdict_problems(replay, lane.test, lane.same_math, lane.must_fail)
    param, metric = lane.headline  # the metric that shows the defect leads its headline
    report = section(replay, lane.test, param)
    headline = next((x for x in report if "golden mismatch" in x), "")
    if f"first divergence at step 0: {metric}" not in headline:
        problems.append(f"[{param}]: {metric} does not lead the headline: {headline}")
    reported = [x for x in replay.outlines if "not comparable across variants" in x]
    if not any(f"{module}.py::{lane.test}[{lane.not_comparable}]" in x for x in reported):
        problems.append(
            f"the summary does not list [{lane.not_comparable}]'s metrics as not comparable"
        )
    outcomes = replay.parseoutcomes()
    counts = (outcomes.get("passed", 0), outcomes.get("failed", 0))
    if counts != (len(lane.same_math), len(lane.must_fail)):
        problems.append(
            f"replay: {counts} passed/failed, want {len(lane.same_math), len(lane.must_fail)}"
        )
    if lane.certify:
        start = time.perf_counter()
        certified = pytester.runpytest_subprocess(*common, "--golden-certify", timeout=600)
        print(f"float64 oracle {time.perf_counter() - start:.1f}s")
        problems += certify_problems(certified, lane)
    assert not problems, "\n".join(problems) + "\n\nreplay output:\n" + "\n".join(replay.outlines)


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


def certify_problems(result: pytest.RunResult, lane: Lane) -> list[str]:
    """What is wrong with the lane's ``--golden-certify`` run: every reference records its
    float64 oracle and every same-math param replays it (certified); every param of
    ``must_fail`` fails as "not the same math", with its metric in the mismatch table."""
    problems = verdict_problems(result, lane.test, lane.same_math, lane.must_fail)
    for param in lane.must_fail:
        if not any("not the same math: " in x for x in section(result, lane.test, param)):
            problems.append(f"[{param}] failed, but not as 'not the same math'")
    if problems:
        problems.append("--golden-certify output:\n" + "\n".join(result.outlines))
    return problems
