"""Prune judges only what this run collected, and reports what it did to each golden.

(1) the goldens of tests in files of any kind (a ``.md`` doctest, a custom ``pytest.File``)
belong to those files, and a collected test skipped on this runner keeps its golden;
(2) a run over part of the project (``testpaths``, a conftest's ``collect_ignore``) deletes
no golden a test it did not collect may own; (3) the summary says which goldens were
deleted and which entries of their directories stayed, and why.
End-to-end through pytester on the real filesystem.
"""

from __future__ import annotations

import pytest

PRUNE_FLAGS = ["--golden-prune", "--golden-prune-tests"]
PRUNED = "pruned unused golden directories:"


def listed(result: pytest.RunResult, header: str) -> list[str]:
    """The directories the summary lists under ``header``."""
    found, inside = [], False
    for line in result.outlines:
        if line == header:
            inside = True
        elif inside and line.startswith("    "):
            found.append(line.strip())
        else:
            inside = False
    return found


def prune_notes(result: pytest.RunResult) -> list[str]:
    """The summary's lines about pruning."""
    return [line for line in result.outlines if line.startswith("--golden-prune")]


# ------------------------------------------------------------------ (1) files of every kind

GUIDE = """
# Guide

>>> import os, pytest
>>> if os.environ.get("NO_GPU"):
...     pytest.skip("needs a GPU")
>>> golden = getfixture("golden")
>>> _ = golden.check({"pg_loss": 1.0})
"""


@pytest.fixture
def guide(project, monkeypatch):
    """guide.md's doctest recorded; from now on this runner skips it (no GPU)."""
    (project.path / "guide.md").write_text(GUIDE)
    project.write("def test_x(golden):\n    golden.check({'kl': 0.5})\n")
    project.run("--doctest-glob=*.md").assert_outcomes(passed=2)
    directory = project.golden / "guide" / "guide.md"
    assert (directory / "manifest.json").is_file()
    monkeypatch.setenv("NO_GPU", "1")
    return project


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_the_golden_of_a_skipped_markdown_doctest_is_kept(guide, flag):
    result = guide.run("--doctest-glob=*.md", flag)
    result.assert_outcomes(passed=1, skipped=1)
    assert (guide.golden / "guide" / "guide.md" / "manifest.json").is_file()
    assert listed(result, PRUNED) == []
    assert prune_notes(result) == []


def test_the_golden_of_a_markdown_file_not_collected_is_kept(guide):
    result = guide.run("--golden-prune-tests")  # no --doctest-glob: guide.md is not collected
    result.assert_outcomes(passed=1)
    assert (guide.golden / "guide" / "guide.md" / "manifest.json").is_file()
    assert listed(result, PRUNED) == []


def test_a_markdown_doctest_that_no_longer_uses_its_golden_is_pruned(guide, monkeypatch):
    monkeypatch.delenv("NO_GPU")
    (guide.path / "guide.md").write_text("# Guide\n\n>>> 1 + 1\n2\n")
    result = guide.run("--doctest-glob=*.md", "--golden-prune")
    result.assert_outcomes(passed=2)
    assert (guide.golden / "guide" / "guide.md" / "manifest.json").is_file(), "guide.md exists"
    result = guide.run("--doctest-glob=*.md", "--golden-prune-tests")
    result.assert_outcomes(passed=2)
    assert listed(result, PRUNED) == ["golden/guide/guide.md"]
    assert not (guide.golden / "guide").exists()


DYNAMIC = """
import os

import pytest


def test_dynamic(request):
    if os.environ.get("NO_GPU"):
        pytest.skip("needs a GPU")
    request.getfixturevalue("golden").check({"pg_loss": 1.0})
"""


def test_the_golden_of_a_skipped_test_reaching_it_dynamically_is_kept(project, monkeypatch):
    project.write(DYNAMIC)
    project.run().assert_outcomes(passed=1)
    monkeypatch.setenv("NO_GPU", "1")
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(skipped=1)
    assert (project.golden_dir("test_dynamic") / "manifest.json").is_file()
    assert listed(result, PRUNED) == []


SPEC_CONFTEST = """
import os

import pytest


def check(golden, request):
    golden.check({"pg_loss": float(len(request.node.name))})


class SpecFile(pytest.File):
    def collect(self):
        for case in self.path.read_text().split():
            if case != "cuda" or os.environ.get("HAS_CUDA"):
                yield pytest.Function.from_parent(self, name=case, callobj=check)


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".spec":
        return SpecFile.from_parent(parent, path=file_path)
"""


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_a_custom_collectors_case_collected_only_elsewhere_is_kept_by_prune(
    project, monkeypatch, flag
):
    (project.path / "conftest.py").write_text(
        (project.path / "conftest.py").read_text() + SPEC_CONFTEST
    )
    (project.path / "cases.spec").write_text("cpu cuda\n")
    monkeypatch.setenv("HAS_CUDA", "1")
    project.run().assert_outcomes(passed=2)
    cuda = project.golden / "cases" / "cuda"
    assert (cuda / "manifest.json").is_file()
    monkeypatch.delenv("HAS_CUDA")
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert (cuda / "manifest.json").is_file(), "cases.spec still exists"
    assert listed(result, "unused golden directories (delete with --golden-prune on a full run):")
    result = project.run("--golden-prune-tests")  # asked explicitly, on a whole run
    result.assert_outcomes(passed=1)
    assert listed(result, PRUNED) == ["golden/cases/cuda"]
    assert (project.golden / "cases" / "cpu" / "manifest.json").is_file()


# ------------------------------------------------------------------ (2) part of the project

BENCH = """
import pytest


@pytest.mark.golden(shared="policy")
def test_bench(golden):
    golden.check({"pg_loss": 0.5})


def test_own(golden):
    golden.check({"kl": 0.25})
"""


@pytest.fixture
def benchmarks(project):
    """tests/test_a.py and benchmarks/test_bench.py, which records @shared/policy."""
    project.pytester.mkdir("tests")
    project.pytester.mkdir("benchmarks")
    project.write("def test_a(golden):\n    golden.check({'kl': 1.0})\n", "tests/test_a")
    project.write(BENCH, "benchmarks/test_bench")
    project.run().assert_outcomes(passed=3)
    assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()
    return project


def test_a_run_over_the_ini_testpaths_keeps_the_shared_golden_of_a_test_outside_them(benchmarks):
    project = benchmarks
    project.pytester.makefile(".ini", pytest="[pytest]\ntestpaths = tests\n")
    before = project.golden_files()
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert project.golden_files() == before
    assert prune_notes(result) == [
        "--golden-prune-tests left alone 1 shared golden(s) (@shared/policy): this run did not "
        "collect the whole project (it collected only testpaths = tests (pytest.ini)), and a test "
        "file it left out may declare them; prune them on a run that collects every test file "
        "(the rootdir as test path, nothing ignored or skipped at collection)"
    ]
    (project.path / "benchmarks" / "test_bench.py").unlink()
    result = project.run(str(project.path), "--golden-prune-tests")  # the remedy it names
    result.assert_outcomes(passed=1)
    assert not (project.golden / "@shared").exists()
    assert not (project.golden / "benchmarks").exists()


def test_a_shared_golden_whose_recording_file_was_not_collected_is_kept(benchmarks):
    project = benchmarks
    # no longer a test file, though collection ignored nothing
    (project.path / "pytest.ini").write_text("[pytest]\npython_files = test_a.py\n")
    before = project.golden_files()
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert project.golden_files() == before
    assert prune_notes(result) == [
        "--golden-prune-tests left alone 1 shared golden(s) (@shared/policy): this run did not "
        "collect the whole project (it did not collect benchmarks/test_bench.py, which recorded "
        "them), and a test file it left out may declare them; prune them on a run that collects "
        "every test file (the rootdir as test path, nothing ignored or skipped at collection)"
    ]


SHARED_A = """
import pytest


@pytest.mark.golden(shared="policy")
def test_a(golden):
    golden.check({"pg_loss": 0.5})
"""

HIDE_BENCHMARKS = {
    "collect_ignore": ("conftest.py", '\ncollect_ignore = ["benchmarks"]\n'),
    "norecursedirs": ("pytest.ini", "norecursedirs = benchmarks\n"),
    "hook": (
        "conftest.py",
        "\n\ndef pytest_ignore_collect(collection_path, config):\n"
        '    return True if collection_path.name == "benchmarks" else None\n',
    ),
}


@pytest.mark.parametrize(
    ("how", "workers"), [*((how, 0) for how in sorted(HIDE_BENCHMARKS)), ("collect_ignore", 2)]
)
def test_a_shared_golden_a_test_in_a_folder_collection_ignored_declares_is_kept(
    project, how, workers
):
    """tests/test_a.py recorded @shared/policy, which benchmarks/test_bench.py also declares;
    test_a drops the marker and collection ignores benchmarks/: the golden stays (under
    xdist too, where the workers collect)."""
    project.pytester.mkdir("tests")
    project.pytester.mkdir("benchmarks")
    (project.path / "pytest.ini").write_text("[pytest]\ngolden_dir = golden\n")
    project.write(SHARED_A, "tests/test_a")
    project.write(BENCH, "benchmarks/test_bench")
    project.run("tests").assert_outcomes(passed=1)
    project.run().assert_outcomes(passed=3)
    project.write("def test_a(golden):\n    golden.check({'kl': 1.0})\n", "tests/test_a")
    name, line = HIDE_BENCHMARKS[how]
    (project.path / name).write_text((project.path / name).read_text() + line)
    if workers:
        result = project.run_subprocess("-n", str(workers), "--golden-prune-tests")
    else:
        result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()
    assert prune_notes(result) == [
        "--golden-prune-tests left alone 1 shared golden(s) (@shared/policy): this run did not "
        "collect the whole project (collection ignored benchmarks), and a test file it left out "
        "may declare them; prune them on a run that collects every test file (the rootdir as "
        "test path, nothing ignored or skipped at collection)"
    ]


# ------------------------------------------------------------------ (3) what the summary says

OUTER = "def test_attention(golden):\n    golden.check({'pg_loss': 1.0})\n"
INNER = "def test_forward(golden):\n    golden.check({'kl': 0.25})\n"


@pytest.fixture
def nested(project):
    """golden/tests/test_models/test_attention/ holding the golden test_forward/."""
    project.pytester.mkdir("tests")
    project.pytester.mkdir("tests/test_models")
    project.write(OUTER, "tests/test_models")
    project.write(INNER, "tests/test_models/test_attention")
    project.write("def test_x():\n    pass\n", "tests/test_other")
    project.run().assert_outcomes(passed=3)
    outer = project.golden / "tests" / "test_models" / "test_attention"
    assert (outer / "test_forward" / "manifest.json").is_file()
    return project


def test_a_pruned_golden_holding_a_pruned_nested_one_is_reported_deleted(nested):
    project = nested
    (project.path / "tests" / "test_models.py").unlink()
    (project.path / "tests" / "test_models" / "test_attention.py").unlink()
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert not (project.golden / "tests" / "test_models").exists()
    assert listed(result, PRUNED) == [
        "golden/tests/test_models/test_attention",
        "golden/tests/test_models/test_attention/test_forward",
    ]
    assert prune_notes(result) == []


def test_a_pruned_golden_holding_one_in_use_says_what_stayed_and_why(nested):
    project = nested
    (project.path / "tests" / "test_models.py").unlink()
    outer = project.golden / "tests" / "test_models" / "test_attention"
    (outer / "notes.txt").write_text("a reviewer's note\n")
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=2)
    assert sorted(p.name for p in outer.iterdir()) == ["notes.txt", "test_forward"]
    assert not (outer / "manifest.json").exists()
    assert listed(result, PRUNED) == ["golden/tests/test_models/test_attention"]
    assert prune_notes(result) == [
        "--golden-prune deleted golden/tests/test_models/test_attention but kept its directory: "
        "it holds entries that golden does not list (notes.txt, test_forward)"
    ]
