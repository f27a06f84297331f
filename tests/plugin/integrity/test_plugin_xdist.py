"""pytest-xdist: workers record and replay without corrupting goldens; the summary merges them."""

from __future__ import annotations

import json
import shutil
import time

import pytest

pytest.importorskip("xdist")

CASES = """
import pytest
import torch


@pytest.mark.parametrize("seed", range(6))
def test_case(golden, values, generated, seed):
    x = torch.rand(256, generator=torch.Generator().manual_seed(seed))
    batch = golden.rollout(lambda: generated(f"case{seed}", {"x": x}))
    golden.check({"pg_loss": float(batch["x"].mean()) + values.get(str(seed), 0.0)})


@pytest.mark.golden(key="shared")
@pytest.mark.parametrize("variant", ["a", "b"])
def test_shared(golden, generated, variant):
    batch = golden.rollout(lambda: generated("shared", {"x": torch.arange(8.0)}))
    golden.check({"loss": float(batch["x"].sum())})
"""


def test_workers_record_replay_update_and_the_summary_merges_their_counts(project):
    project.write(CASES)
    project.set_values()
    recorded = project.run_subprocess("-n", "2")
    recorded.assert_outcomes(passed=8)
    recorded.stdout.fnmatch_lines(["*2 workers*"])
    assert project.counts(recorded) == {"replayed": 1, "recorded": 7, "updated": 0, "failed": 0}
    assert sorted(project.calls()) == [f"case{i}" for i in range(6)] + ["shared"]
    assert not [p for p in project.golden.rglob(".*")], "no staging or backup left behind"

    # A golden of a deleted test file, and a drift in one case.
    shutil.copytree(project.golden_dir("test_case[0]"), project.golden / "test_gone" / "test_x")
    project.set_values(**{"3": 0.01})
    replayed = project.run_subprocess("-n", "2", "--golden-strict", "--golden-report", "r.json")
    replayed.assert_outcomes(passed=7, failed=1)
    assert project.calls() == []
    assert project.counts(replayed) == {"replayed": 7, "recorded": 0, "updated": 0, "failed": 1}
    replayed.stdout.fnmatch_lines(
        [
            "unused golden directories (delete with --golden-prune on a full run):",
            "    golden/test_gone/test_x",
        ]
    )
    assert replayed.stdout.str().count("golden/test_gone/test_x") == 1
    report = json.loads((project.path / "r.json").read_text())
    assert len(report["comparisons"]) == 8
    assert [c["metric"] for c in report["comparisons"] if c["verdict"] == "fail"] == ["pg_loss"]

    # --update-golden on both workers: the shared golden is re-recorded once, then replayed.
    project.set_values()
    updated = project.run_subprocess("-n", "2", "--update-golden")
    updated.assert_outcomes(passed=8)
    assert project.counts(updated) == {"replayed": 1, "recorded": 0, "updated": 7, "failed": 0}
    assert project.calls().count("shared") == 0, "recorded rollouts are kept"
    project.run("--golden-strict").assert_outcomes(passed=8)  # every golden still loads


def test_a_marker_mistake_is_reported_under_xdist_too(project):
    # xdist turns a usage error raised while a worker collects into "no tests ran" and exit 5,
    # without the message; the test itself must fail with it.
    project.write(
        """
import pytest

@pytest.mark.golden(tolerance={"pg_loss": {"rtol": 1e-3}})  # typo: tolerances=
def test_typo(golden):
    golden.check({"pg_loss": 0.5})

def test_other():
    pass
"""
    )
    result = project.run_subprocess("-n", "2")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.re_match_lines([r"UsageError: .*unknown option tolerance= \(did you mean"])
    assert "def marker_options" not in result.stdout.str()  # the message, not our traceback
    assert not project.golden.exists()
    single = project.run_subprocess()  # without xdist the same
    single.assert_outcomes(passed=1, errors=1)
    single.stdout.re_match_lines([r"UsageError: .*unknown option tolerance= \(did you mean"])


# The reference is slow to reach its golden: under `-n 2` its variant starts on the other
# worker first, as a first run of a real project's variants does.
VARIANTS = """
import time

import pytest
from pytest_rollout_golden import same_math


@pytest.fixture
def slow_reference(request):
    if request.node.callspec.id == "mb8":
        time.sleep(3)


@pytest.mark.parametrize("micro", same_math([8, 4], ids=lambda v: f"mb{v}"))
def test_actor(slow_reference, golden, values, micro):
    golden.check({"loss": 0.5 + values.get("shift", 0.0)})
"""


def test_a_variant_waits_for_its_reference_on_another_worker(project):
    project.write(VARIANTS)
    project.set_values()
    first = project.run_subprocess("-n", "2", "-rA")
    first.assert_outcomes(passed=2)
    assert project.counts(first) == {"replayed": 1, "recorded": 1, "updated": 0, "failed": 0}

    project.set_values(shift=0.01)  # new code: the reference re-records, its variant agrees
    updated = project.run_subprocess("-n", "2", "--update-golden")
    updated.assert_outcomes(passed=2)
    assert project.counts(updated) == {"replayed": 1, "recorded": 0, "updated": 1, "failed": 0}

    replayed = project.run_subprocess("-n", "2", "--golden-strict")
    replayed.assert_outcomes(passed=2)


def test_a_variant_whose_reference_fails_fails_naming_the_reference(project):
    project.write(VARIANTS.replace("golden.check(", "assert micro != 8\n    golden.check("))
    project.set_values()
    result = project.run_subprocess("-n", "2")
    result.assert_outcomes(passed=0, failed=2)
    result.stdout.fnmatch_lines(["*test_actor?mb4?*reference*mb8*"])


def test_a_variant_queued_before_its_reference_on_one_worker_does_not_wait(project):
    """The reference behind its variant on the same worker cannot finish first: the variant
    goes on at once (as without xdist) instead of waiting out the wait's cap."""
    project.write(VARIANTS)
    conftest = project.path / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\n\ndef pytest_collection_modifyitems(items):\n    items.reverse()\n"
    )
    project.set_values()
    started = time.monotonic()
    first = project.run_subprocess("-n", "2", "--dist", "loadfile")
    assert time.monotonic() - started < 120, "the variant waited for a reference queued behind it"
    first.assert_outcomes(passed=1, failed=1)
    first.stdout.fnmatch_lines(["*test_actor?mb4?*"])
    project.run_subprocess("-n", "2", "--dist", "loadfile").assert_outcomes(passed=2)
