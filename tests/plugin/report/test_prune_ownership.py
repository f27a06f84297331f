"""Which goldens ``--golden-prune`` may delete: only those this project provably owns and
no test of this run used.

(a) a golden root shared with another project (``golden_dir = ../golden``), (b) a
``shared=`` golden used by a file this run did not collect, (c) a golden reached through
``request.getfixturevalue("golden")`` or a doctest's ``getfixture("golden")``.
End-to-end through pytester on the real filesystem.
"""

from __future__ import annotations

import shutil

import pytest

PRUNE_FLAGS = ["--golden-prune", "--golden-prune-tests"]
UNUSED = "unused golden directories (delete with --golden-prune on a full run):"


def unused_lines(result: pytest.RunResult) -> list[str]:
    """The directories the summary lists as unused (or pruned)."""
    lines, found, inside = result.outlines, [], False
    for line in lines:
        if line in (UNUSED, "pruned unused golden directories:"):
            inside = True
        elif inside and line.startswith("    "):
            found.append(line.strip())
        else:
            inside = False
    return found


def _check(name: str, value: float = 1.0) -> str:
    return f"def {name}(golden):\n    golden.check({{'pg_loss': {value}}})\n"


# ------------------------------------------------------------------ (a) a golden root shared


@pytest.fixture
def two_projects(project):
    """Projects a/ and b/ beside each other, both with ``golden_dir = ../golden``."""
    for name in ("a", "b"):
        project.pytester.mkdir(name)
        (project.path / name / "pytest.ini").write_text("[pytest]\ngolden_dir = ../golden\n")
    (project.path / "a" / "test_a.py").write_text(_check("test_x") + "\n\n" + _check("test_old"))
    (project.path / "a" / "test_gone.py").write_text(_check("test_g"))
    (project.path / "b" / "test_b.py").write_text(_check("test_y"))
    project.run("a").assert_outcomes(passed=3)
    project.run("b").assert_outcomes(passed=1)
    assert (project.golden / "test_b" / "test_y" / "manifest.json").is_file()
    return project


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_a_whole_run_keeps_the_goldens_of_another_project_sharing_the_golden_root(
    two_projects, flag
):
    project = two_projects
    theirs = project.golden / "test_b" / "test_y"
    result = project.run("a", flag)
    result.assert_outcomes(passed=3)
    assert (theirs / "manifest.json").is_file(), "b's golden survives a's prune"
    assert not any("test_b/test_y" in line for line in unused_lines(result)), "not a's to judge"
    result.stdout.fnmatch_lines(
        [
            f"{flag} left alone 1 golden(s) under * whose test file is not under rootdir *a "
            "(test_b/test_y): golden_dir lies outside the rootdir*another project*"
            "delete them by hand*"
        ]
    )


def test_a_shared_golden_root_still_prunes_what_is_provably_ours(two_projects):
    project = two_projects
    (project.path / "a" / "test_a.py").write_text(_check("test_x"))  # test_old removed
    (project.path / "a" / "test_gone.py").unlink()
    result = project.run("a", "--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert not (project.golden / "test_a" / "test_old").exists(), "test_a.py is a's file"
    assert (project.golden / "test_a" / "test_x" / "manifest.json").is_file()
    # test_gone.py is gone from a/, but nothing proves the golden was a's rather than b's.
    assert (project.golden / "test_gone" / "test_g" / "manifest.json").is_file()
    assert (project.golden / "test_b" / "test_y" / "manifest.json").is_file()
    result.stdout.fnmatch_lines(
        ["*left alone 2 golden(s) under *(test_b/test_y, test_gone/test_g)*"]
    )


def test_a_golden_root_inside_the_rootdir_prunes_gone_files_as_before(project):
    project.write(_check("test_g"), "test_gone")
    project.write(_check("test_x"))
    project.run().assert_outcomes(passed=2)
    (project.path / "test_gone.py").unlink()
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert not (project.golden / "test_gone").exists()
    assert "left alone" not in result.stdout.str()


# ------------------------------------------------------------------ (b) shared= goldens

REFERENCE = """
import shutil

import pytest

@pytest.mark.golden(shared="policy")
def test_reference(golden):
    golden.check({"pg_loss": 0.5})
"""
USER = """
import shutil

import pytest

@pytest.mark.golden(shared="policy")
def test_user(golden):
    golden.check({"pg_loss": 0.5})
"""


@pytest.fixture
def shared(project):
    """@shared/policy recorded by test_a.py, replayed by test_b.py; test_c.py uses nothing."""
    project.write(REFERENCE, "test_a")
    project.write(USER, "test_b")
    project.write("def test_other():\n    pass\n", "test_c")
    project.run().assert_outcomes(passed=3)
    policy = project.golden / "@shared" / "policy"
    assert (policy / "manifest.json").is_file()
    return project


@pytest.mark.parametrize("moved", ["file_removed", "test_moved_out"])
@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_a_shared_golden_whose_recorder_moved_is_kept_while_another_file_may_use_it(
    shared, moved, flag
):
    project = shared
    policy = project.golden / "@shared" / "policy"
    project.write(REFERENCE, "test_new")  # the recording test moved to another file
    if moved == "file_removed":
        (project.path / "test_a.py").unlink()
        selection = "test_c.py"
    else:
        project.write("def test_kept():\n    pass\n", "test_a")
        selection = "test_a.py"
    result = project.run(selection, flag)
    result.assert_outcomes(passed=1)
    assert (policy / "manifest.json").is_file(), "test_b.py and test_new.py still use it"
    assert not any("@shared" in line for line in unused_lines(result)), "not listed as unused"
    if flag == "--golden-prune-tests":
        result.stdout.fnmatch_lines(
            [
                "--golden-prune-tests left alone 1 shared golden(s) (@shared/policy): this run "
                "did not collect the whole project*every test file (the rootdir as test path*"
            ]
        )


def test_a_shared_golden_is_kept_when_a_file_was_skipped_at_collection(shared):
    project = shared
    (project.path / "test_a.py").unlink()
    project.write('import pytest\n\npytest.importorskip("no_such_module")\n' + USER, "test_b")
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1, skipped=1)
    assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()
    result.stdout.fnmatch_lines(
        ["--golden-prune-tests left alone 1 shared golden(s) (@shared/policy): *test_b.py*"]
    )


def test_a_shared_golden_no_test_of_a_whole_project_run_declares_is_deleted_and_named(shared):
    project = shared
    (project.path / "test_a.py").unlink()
    (project.path / "test_b.py").unlink()
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert not (project.golden / "@shared" / "policy").exists()
    result.stdout.fnmatch_lines(
        [
            "--golden-prune-tests deleted 1 shared golden(s) no test of this whole-project run "
            "declares: @shared/policy"
        ]
    )


def test_a_shared_golden_used_by_a_collected_file_is_never_pruned(shared):
    project = shared
    (project.path / "test_a.py").unlink()
    for selection in ([], ["test_b.py"]):
        result = shared.run(*selection, "--golden-prune-tests")
        result.assert_outcomes(passed=len(selection) or 2)
        assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()


# ------------------------------------------------------------------ (c) however it was reached

DYNAMIC = """
def test_dynamic(request):
    golden = request.getfixturevalue("golden")
    golden.check({"pg_loss": 1.0})
"""
DOCTEST = '''
def policy_loss():
    """
    >>> golden = getfixture("golden")
    >>> _ = golden.check({"pg_loss": 1.0})
    """
'''


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_a_golden_reached_through_getfixturevalue_is_used(project, flag):
    project.write(DYNAMIC)
    project.run().assert_outcomes(passed=1)
    directory = project.golden_dir("test_dynamic")
    assert (directory / "manifest.json").is_file()
    result = project.run(flag)
    result.assert_outcomes(passed=1)
    assert project.counts(result)["replayed"] == 1
    assert (directory / "manifest.json").is_file()
    assert UNUSED not in result.outlines
    assert "pruned unused" not in result.stdout.str()


def test_a_golden_reached_through_a_doctest_getfixture_is_used(project):
    project.write(DOCTEST, "policy")
    project.run("--doctest-modules").assert_outcomes(passed=1)
    directory = project.golden / "policy" / "policy.policy_loss"
    assert (directory / "manifest.json").is_file()
    result = project.run("--doctest-modules", "--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert project.counts(result)["replayed"] == 1
    assert (directory / "manifest.json").is_file()
    assert UNUSED not in result.outlines


def test_a_golden_no_longer_opened_by_an_existing_test_is_still_pruned(project):
    project.write(DYNAMIC)
    project.run().assert_outcomes(passed=1)
    project.write("def test_dynamic():\n    pass\n")
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=1)
    assert not project.golden_dir("test_dynamic").exists()


# ------------------------------------------------------------------ the decisions, without pytest


def test_a_golden_root_outside_the_rootdir_or_linked_out_of_it_may_be_shared(tmp_path):
    from pytest_rollout_golden._internal.pytest_plugin.prune import outside_rootdir

    rootdir = tmp_path / "a"
    (rootdir / "golden").mkdir(parents=True)
    assert not outside_rootdir(rootdir / "golden", rootdir)
    assert outside_rootdir(rootdir / ".." / "golden", rootdir)
    (tmp_path / "store").mkdir()
    (rootdir / "linked").symlink_to(tmp_path / "store", target_is_directory=True)
    assert outside_rootdir(rootdir / "linked", rootdir)


def test_partial_project_says_why_a_run_may_have_left_test_files_out(tmp_path):
    from pytest_rollout_golden._internal.pytest_plugin.prune import partial_project

    def why(args, testpaths="", ignored=(), skipped=()):
        return partial_project(
            args, tmp_path, testpaths=testpaths, ignored=ignored, skipped=skipped
        )

    tests = tmp_path / "tests"
    assert why([tmp_path]) == ""
    assert why([tmp_path], testpaths="testpaths = . (pytest.ini)") == ""
    ini = "testpaths = tests (pytest.ini)"  # benchmarks/ may declare a shared golden
    assert why([tests], testpaths=ini) == f"it collected only {ini}"
    assert why([tests, tmp_path / "docs"]) == "it collected only docs, tests"
    assert why([tests / "test_c.py"]) == "it collected only tests/test_c.py"
    assert why([tmp_path], ignored=["tests/slow"]) == "--ignore tests/slow left files out"
    skipped = [str(tests / "test_vllm.py"), str(tests / "test_cuda.py")]
    assert why([tmp_path], skipped=skipped) == (
        "tests/test_cuda.py and 1 more were skipped at collection"
    )


def test_opened_and_skipped_files_survive_the_xdist_merge():
    from pytest_rollout_golden._internal.pytest_plugin.session import SessionState

    worker = SessionState()
    worker.opened_dirs.add("/p/golden/test_it/test_dynamic")
    worker.skipped_files.add("/p/test_vllm.py")
    merged = SessionState()
    merged.merge_json(worker.to_json())
    assert merged.used_dirs() == {"/p/golden/test_it/test_dynamic"}
    assert merged.skipped_files == {"/p/test_vllm.py"}


# ------------------------------------------------------------------ (d) a golden's lanes

LANED = """
import torch


def test_step(golden, values):
    batch = golden.rollout(lambda: {"x": torch.arange(4.0)})
    golden.check({"pg_loss": values.get("loss", 0.5) * float(batch["x"].sum())})
"""


@pytest.fixture
def laned(project):
    """test_gone.py's and test_it.py's goldens, each with lane cpu (its base) and lane gpu."""
    project.write(LANED, "test_gone")
    project.write(LANED)
    project.run("--golden-lane", "cpu").assert_outcomes(passed=2)
    project.set_values(loss=0.6)
    project.run("--golden-lane", "gpu").assert_outcomes(passed=2)
    for module in ("test_gone", "test_it"):
        lane = project.golden_dir("test_step", module) / "@lanes" / "gpu"
        assert (lane / "manifest.json").is_file()
    return project


def test_prune_deletes_an_unused_golden_with_its_lanes(laned):
    project = laned
    (project.path / "test_gone.py").unlink()
    result = project.run("--golden-prune", "--golden-lane", "gpu")
    result.assert_outcomes(passed=1)
    assert not (project.golden / "test_gone").exists(), "the golden, its lanes and its folder"
    assert unused_lines(result) == ["golden/test_gone/test_step"]
    assert "kept" not in result.stdout.str()
    kept = project.golden_dir("test_step") / "@lanes" / "gpu"
    assert (kept / "manifest.json").is_file() and (kept / "metrics.json").is_file()


def test_a_lane_holding_what_it_does_not_list_is_left_with_it_and_reported(laned, tmp_path):
    project = laned
    golden = project.golden_dir("test_step", "test_gone")
    (golden / "@lanes" / "gpu" / "notes.txt").write_text("mine")
    elsewhere = tmp_path / "elsewhere"  # a lane linked in from outside the golden root
    shutil.copytree(golden / "@lanes" / "gpu", elsewhere)
    (golden / "@lanes" / "linked").symlink_to(elsewhere, target_is_directory=True)
    outside = sorted(p.name for p in elsewhere.iterdir())
    (project.path / "test_gone.py").unlink()

    result = project.run("--golden-prune", "--golden-lane", "gpu")
    result.assert_outcomes(passed=1)
    assert sorted(p.name for p in elsewhere.iterdir()) == outside, "a link is never followed"
    assert (golden / "@lanes" / "gpu" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (golden / "@lanes" / "gpu").iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in golden.iterdir()) == ["@lanes"]
    result.stdout.fnmatch_lines(
        [
            "--golden-prune deleted golden/test_gone/test_step but kept its directory: it holds "
            "entries that golden does not list (@lanes/gpu/notes.txt, @lanes/linked)"
        ]
    )


@pytest.mark.parametrize(
    ("lane", "loss"), [([], 0.5), (["--golden-lane", "gpu"], 0.6), (["--golden-lane", "cpu"], 0.5)]
)
def test_the_lanes_of_a_golden_in_use_are_never_pruned(laned, lane, loss):
    project = laned
    project.set_values(loss=loss)
    before = project.golden_files()
    result = project.run("--golden-prune-tests", *lane)
    result.assert_outcomes(passed=2)
    assert project.golden_files() == before
    assert unused_lines(result) == []


def test_a_lane_is_never_a_golden_of_its_own(laned):
    project = laned
    (project.path / "test_gone.py").unlink()
    result = project.run("--golden-lane", "gpu")
    result.assert_outcomes(passed=1)
    assert unused_lines(result) == ["golden/test_gone/test_step"]
