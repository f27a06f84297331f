"""Where goldens live: one directory per test and parametrized case, ``key=`` sharing, roots."""

from __future__ import annotations

import pytest

CASES = """
import pytest
import torch


@pytest.mark.parametrize("lr", [0.1, 0.2])
def test_case(golden, lr):
    golden.check({"pg_loss": lr})


class TestGroup:
    def test_method(self, golden):
        golden.check({"pg_loss": 1.0})


def test_plain(golden):
    golden.check({"pg_loss": 1.0})


def test_without_golden():
    pass
"""


def manifests(root) -> list[str]:
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("manifest.json"))


def test_one_directory_per_test_and_case(project):
    project.write(CASES)
    project.pytester.mkpydir("sub")
    project.write(CASES, "sub/test_nested")
    project.run().assert_outcomes(passed=10)
    expected = [
        "test_it/TestGroup/test_method",
        "test_it/test_case[0.1]",
        "test_it/test_case[0.2]",
        "test_it/test_plain",
    ]
    nested = [x.replace("test_it/", "sub/test_nested/") for x in expected]
    assert manifests(project.golden) == sorted(expected + nested)


@pytest.mark.parametrize("how", ["ini", "cli"])
def test_golden_root_from_ini_or_command_line(project, how):
    project.write(CASES)
    if how == "ini":
        project.pytester.makeini("[pytest]\ngolden_dir = tests/goldens\n")
        project.run().assert_outcomes(passed=5)
    else:
        project.run("--golden-dir", "tests/goldens").assert_outcomes(passed=5)
    assert not project.golden.exists()
    assert len(manifests(project.path / "tests" / "goldens")) == 4


SHARED = """
import pytest
import torch


@pytest.mark.golden(key="layouts")
@pytest.mark.parametrize("scale", [1.0, 1.0, 1.001], ids=["first", "same", "drift"])
def test_layout(golden, generated, scale):
    batch = golden.rollout(lambda: generated("rollout", {"x": torch.ones(4)}))
    golden.check({"pg_loss": float(batch["x"].sum()) * scale})
"""


def test_shared_key_second_case_replays_first_and_drift_fails(project):
    project.write(SHARED)
    result = project.run()
    result.assert_outcomes(passed=2, failed=1)
    assert project.calls() == ["rollout"], "only the first case generates"
    assert manifests(project.golden) == ["test_it/layouts"]
    assert project.metrics("layouts") == {"0": {"pg_loss": 4.0}}
    assert project.counts(result) == {"replayed": 1, "recorded": 1, "updated": 0, "failed": 1}
    assert "FAILED test_it.py::test_layout[drift] - golden mismatch" in result.stdout.str()

    # --update-golden re-records the shared golden once; later cases compare against it.
    updated = project.run("--update-golden")
    updated.assert_outcomes(passed=2, failed=1)
    assert project.calls() == [], "the recorded rollout is kept"
    assert project.counts(updated) == {"replayed": 1, "recorded": 0, "updated": 1, "failed": 1}
    assert project.metrics("layouts") == {"0": {"pg_loss": 4.0}}, "the drift was not recorded"
