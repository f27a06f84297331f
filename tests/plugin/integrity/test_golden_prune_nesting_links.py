"""No golden lost, none wrongly written: prune, nesting, subtests, report path, symlinks.

End-to-end through pytester on the real filesystem: a real ``--lf`` run, a real
conftest trimming ``items[:]``, real nested and symlinked directories.
"""

from __future__ import annotations

import json
import os

import pytest

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenError

CASES = """
import os

import pytest

DEVICES = os.environ.get("DEVICES", "cpu").split(",")


def test_one(golden):
    golden.check({"pg_loss": 1.0})


def test_two(golden, values):
    golden.check({"pg_loss": 2.0 * values.get("scale", 1.0)})


@pytest.mark.parametrize("device", DEVICES)
def test_device(golden, device):
    golden.check({"pg_loss": 3.0})
"""
PRUNE_FLAGS = ["--golden-prune", "--golden-prune-tests"]


def run_with_cache(project, *args: str) -> pytest.RunResult:
    """A run with the cache provider on, as a user's ``--lf`` needs it."""
    return project.pytester.runpytest("-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


@pytest.fixture
def cases(project, monkeypatch):
    """test_it.py recorded with a cuda case, on a machine that only collects cpu from now on."""
    project.write(CASES)
    monkeypatch.setenv("DEVICES", "cpu,cuda")
    project.run().assert_outcomes(passed=4)
    monkeypatch.setenv("DEVICES", "cpu")
    return project


# ------------------------------------------------------------------ 1. prune only a whole run


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_prune_after_last_failed_deletes_nothing(cases, flag):
    cases.set_values(scale=1.5)
    run_with_cache(cases).assert_outcomes(passed=2, failed=1)  # test_two fails, is cached
    cases.set_values(scale=1.0)
    before = cases.golden_files()
    result = run_with_cache(cases, "--lf", flag)
    result.assert_outcomes(passed=1)  # --lf ran test_two alone, no pytest_deselected call
    assert cases.golden_files() == before
    result.stdout.fnmatch_lines(["--golden-prune skipped: some tests were deselected, filtered*"])


@pytest.mark.parametrize("flag", PRUNE_FLAGS)
def test_prune_after_a_conftest_trimmed_items_deletes_nothing(cases, flag):
    conftest = cases.path / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\n\ndef pytest_collection_modifyitems(config, items):\n"
        + "    items[:] = [i for i in items if 'two' not in i.name]  # 'skip slow unless asked'\n"
    )
    before = cases.golden_files()
    result = cases.run(flag)
    result.assert_outcomes(passed=2)
    assert cases.golden_files() == before
    result.stdout.fnmatch_lines(["--golden-prune skipped: some tests were deselected, filtered*"])


def test_prune_keeps_a_case_collected_only_on_other_machines_unless_asked(cases):
    cuda = cases.golden_dir("test_device[cuda]")
    result = cases.run("--golden-prune")
    result.assert_outcomes(passed=3)
    assert (cuda / "manifest.json").is_file()
    result.stdout.fnmatch_lines(
        [
            "unused golden directories*",
            "    golden/test_it/test_device[cuda]",
            "--golden-prune kept 1 unused golden(s) of test files that still exist (a removed "
            "test, or a case collected only on other machines, e.g. cuda)*",
        ]
    )
    result = cases.run("--golden-prune-tests")  # asked explicitly, on a whole run
    result.assert_outcomes(passed=3)
    assert not cuda.exists()
    assert (cases.golden_dir("test_device[cpu]") / "manifest.json").is_file()


def test_unused_goldens_of_existing_files_are_flagged_without_prune(cases):
    result = cases.run()
    result.stdout.fnmatch_lines(
        [
            "    golden/test_it/test_device[cuda]",
            "1 of them belong to test files that still exist*--golden-prune keeps those*",
        ]
    )


# ------------------------------------------------------------------ 2. only our own, only inside


def test_golden_dir_that_is_the_project_or_empty_is_refused(project):
    project.write(CASES)
    static = project.path / "web" / "static"
    static.mkdir(parents=True)
    (static / "manifest.json").write_text('{"name": "app", "icons": []}\n')
    project.pytester.makeini("[pytest]\ngolden_dir = .\n")
    result = project.run("--golden-prune-tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*golden_dir '.' is the project directory or contains it*"])
    result = project.run("--golden-dir=", "--golden-prune")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*golden_dir is empty*"])
    assert (static / "manifest.json").is_file()
    assert not (project.path / "test_it").exists(), "nothing was recorded into the project"


def test_prune_never_touches_a_directory_whose_manifest_is_not_ours(project):
    project.write(CASES)
    project.run().assert_outcomes(passed=3)
    foreign = project.golden / "web" / "static"
    foreign.mkdir(parents=True)
    (foreign / "manifest.json").write_text('{"name": "app", "format": "webmanifest"}\n')
    (foreign / "app.js").write_text("1\n")
    result = project.run("--golden-prune-tests")
    result.assert_outcomes(passed=3)
    assert "golden/web/static" not in result.stdout.str()
    assert sorted(p.name for p in foreign.iterdir()) == ["app.js", "manifest.json"]


def test_prune_deletes_only_the_files_a_golden_lists(project, tmp_path):
    project.write(CASES, "test_gone")
    project.run().assert_outcomes(passed=3)
    directory = project.golden_dir("test_one", "test_gone")
    (directory / "notes.txt").write_text("a reviewer's note\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    manifest = json.loads(
        (project.golden_dir("test_two", "test_gone") / "manifest.json").read_text()
    )
    manifest["files"][str(victim)] = {"digest": "0"}  # a crafted entry naming a path
    manifest["files"]["../test_one/notes.txt"] = {"digest": "0"}
    (project.golden_dir("test_two", "test_gone") / "manifest.json").write_text(json.dumps(manifest))
    (project.path / "test_gone.py").unlink()
    project.write("def test_x():\n    pass\n", "test_other")
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert victim.read_text() == "keep\n"
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"], "only ours deleted"
    result.stdout.fnmatch_lines(
        [
            "--golden-prune deleted golden/test_gone/test_one but kept its directory: it holds "
            "entries that golden does not list (notes.txt)"
        ]
    )
    assert not project.golden_dir("test_two", "test_gone").exists()


# ------------------------------------------------------------------ 3. a golden inside another

OUTER = """
def test_attention(golden, values):
    golden.check({"pg_loss": values.get("outer", 1.0)})
    if values.get("second_step", True):
        golden.check({"pg_loss": 2.0}, step=1)
"""
INNER = """
def test_forward(golden):
    golden.check({"kl": 0.25})
"""


def test_recording_an_outer_golden_keeps_the_inner_one_and_foreign_files(project):
    project.pytester.mkdir("tests")
    project.pytester.mkdir("tests/test_models")
    project.write(OUTER, "tests/test_models")
    project.write(INNER, "tests/test_models/test_attention")
    project.run().assert_outcomes(passed=2)
    outer = project.golden / "tests" / "test_models" / "test_attention"
    inner = outer / "test_forward"
    assert (inner / "manifest.json").is_file(), "the two goldens nest"
    (outer / "README.txt").write_text("why this golden changed\n")
    inner_files = {p.name: p.read_bytes() for p in inner.iterdir()}

    project.set_values(outer=1.5, second_step=False)
    result = project.run("--update-golden", "tests/test_models.py")
    result.assert_outcomes(passed=1)
    assert project.counts(result)["updated"] == 1
    assert {p.name: p.read_bytes() for p in inner.iterdir()} == inner_files
    assert (outer / "README.txt").read_text() == "why this golden changed\n"
    manifest = json.loads((outer / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["metrics.json"]
    assert json.loads((outer / "metrics.json").read_text())["steps"] == {"0": {"pg_loss": 1.5}}
    assert not [p for p in outer.parent.iterdir() if p.name.startswith(".")], "no leftovers"
    project.run("--golden-strict").assert_outcomes(passed=2)


# ------------------------------------------------------------------ 4. subtests


SUBTESTS = """
def test_sub(golden, subtests, values):
    golden.check({"pg_loss": values.get("loss", 1.0)})
    for i in range(3):
        with subtests.test(i=i):
            assert values.get("ok", True)
"""


def test_a_test_failing_through_subtests_records_nothing(project):
    project.write(SUBTESTS)
    project.set_values(ok=False)
    result = project.run()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not project.golden.exists()
    project.set_values(ok=True)
    project.run().assert_outcomes(passed=1)
    before = project.golden_files()
    project.set_values(ok=False, loss=2.0)
    result = project.run("--update-golden")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "1 updated" not in result.stdout.str()
    assert project.golden_files() == before


# ------------------------------------------------------------------ 14. the report, the disk

ONE = """
def test_one(golden):
    golden.check({"pg_loss": 1.0})
"""


@pytest.mark.parametrize("where", ["a_directory", "a_file/report.json"])
def test_a_report_path_that_cannot_be_written_is_refused_before_any_test(project, where):
    project.write(ONE)
    (project.path / "a_directory").mkdir()
    (project.path / "a_file").write_text("")
    result = project.run(f"--golden-report={where}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--golden-report {where}: *"])
    assert not project.golden.exists(), "no test ran"


def test_collect_only_keeps_an_existing_report(project):
    project.write(ONE)
    project.run("--golden-report=report.json").assert_outcomes(passed=1)
    before = (project.path / "report.json").read_bytes()
    assert json.loads(before)["summary"]["recorded"] == 1
    result = project.run("--collect-only", "--golden-report=report.json")
    assert result.ret == pytest.ExitCode.OK
    assert (project.path / "report.json").read_bytes() == before
    assert "golden report written" not in result.stdout.str()


def test_a_report_on_a_full_disk_names_the_file_and_fails_the_run(project):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    project.write(ONE)
    result = project.run("--golden-report=/dev/full")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["--golden-report /dev/full: NOT written (No space left on device); free disk space*"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_golden_on_a_full_disk_names_the_file_and_keeps_the_old_one(project, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=64k tmpfs {disk} 2>/dev/null"):
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        project.write(
            "import torch\n\ndef test_big(golden, values):\n"
            "    golden.check_tensors('x', {'x': torch.zeros(values.get('n', 8))})\n"
        )
        project.run(f"--golden-dir={disk}").assert_outcomes(passed=1)
        before = {p: p.read_bytes() for p in disk.rglob("*") if p.is_file()}
        project.set_values(n=1_000_000)  # 4 MB on a 64 KiB filesystem
        result = project.run(f"--golden-dir={disk}", "--update-golden")
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                "*GoldenError: *test_big*: no space left on device while writing it; nothing was "
                "committed and the previous golden is intact. Free disk space*"
            ]
        )
        assert {p: p.read_bytes() for p in disk.rglob("*") if p.is_file()} == before
    finally:
        os.system(f"umount {disk}")


def test_a_path_option_written_with_a_space_is_detected(project, tmp_path_factory):
    project.write(ONE)
    project.pytester.makeini("[pytest]\ngolden_dir = golden\n")
    elsewhere = tmp_path_factory.mktemp("reports") / "report.json"
    elsewhere.write_text("{}")
    result = project.run("--golden-report", str(elsewhere))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*`--golden-report {elsewhere}`: pytest took {elsewhere} for a test path*"
            f"write `--golden-report={elsewhere}`"
        ]
    )
    project.run(f"--golden-report={elsewhere}").assert_outcomes(passed=1)
    project.run("--golden-dir", "golden").assert_outcomes(passed=1)  # harmless: same rootdir


def test_an_infinite_golden_against_a_finite_value_shows_an_infinite_relative_difference(
    project,
):
    project.write(
        "def test_inf(golden, values):\n    golden.check({'kl': values.get('kl', float('inf'))})\n"
    )
    project.run().assert_outcomes(passed=1)
    project.set_values(kl=1.0)
    result = project.run()
    result.assert_outcomes(failed=1)
    assert project.mismatch_row(result, "kl")["rel diff"] == "inf"


# ------------------------------------------------------------------ 15. symbolic links


def test_updating_a_golden_whose_directory_is_a_link_replaces_its_target(project):
    project.write(ONE)
    store = project.golden / ".store" / "test_one"
    store.mkdir(parents=True)
    (project.golden / "test_it").mkdir()
    link = project.golden_dir("test_one")
    link.symlink_to(store, target_is_directory=True)
    project.run().assert_outcomes(passed=1)
    assert (store / "manifest.json").is_file()
    result = project.run("--update-golden")
    result.assert_outcomes(passed=1)
    assert link.is_symlink() and (store / "manifest.json").is_file()
    leftovers = [p.name for p in link.parent.iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in store.parent.iterdir() if p.name != "test_one"]
    assert leftovers == []
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_a_link_out_of_the_golden_root_is_refused(project, tmp_path):
    project.write(ONE)
    outside = tmp_path / "outside"
    outside.mkdir()
    project.golden.mkdir()
    (project.golden / "test_it").symlink_to(outside, target_is_directory=True)
    result = project.run()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*golden/test_it is a symbolic link to *outside, outside the golden root*"]
    )
    assert list(outside.iterdir()) == [], "nothing was recorded outside the repository"


def test_prune_never_follows_a_link(project, tmp_path):
    project.write(ONE, "test_gone")
    project.run().assert_outcomes(passed=1)
    outside = tmp_path / "outside"
    (project.golden / "test_gone").rename(outside)
    (project.golden / "test_gone").symlink_to(outside, target_is_directory=True)
    (project.path / "test_gone.py").unlink()
    project.write("def test_x():\n    pass\n", "test_other")
    result = project.run("--golden-prune")
    result.assert_outcomes(passed=1)
    assert (outside / "test_one" / "manifest.json").is_file()
    assert "pruned" not in result.stdout.str()
    with pytest.raises(GoldenError, match="reached through a symbolic link; not deleted"):
        store.remove_golden(project.golden / "test_gone" / "test_one", project.golden)
    with pytest.raises(GoldenError, match="not inside the golden root"):
        store.remove_golden(outside / "test_one", project.golden)
    assert (outside / "test_one" / "manifest.json").is_file()


def _golden_with_an_inner_one(tmp_path):
    """Golden ``outer`` (one file) holding a nested golden ``inner`` and a user's note."""
    outer = tmp_path / "golden" / "outer"
    tx = store.Transaction(outer)
    tx.write_json("metrics.json", {"v": 1})
    tx.commit({})
    tx = store.Transaction(outer / "inner")
    tx.write_json("metrics.json", {"v": "inner"})
    tx.commit({})
    (outer / "NOTES.txt").write_text("mine")
    return outer


def test_a_commit_failing_past_its_commit_point_leaves_nested_entries_alone(tmp_path, monkeypatch):
    """The commit moves only the outer golden's files: a failure part-way touches neither
    the inner golden nor the note, and the next recovery finishes the committed version."""
    outer = _golden_with_an_inner_one(tmp_path)
    tx = store.Transaction(outer)
    tx.write_json("metrics.json", {"v": 2})
    real_replace = os.replace

    def failing(src, dst):  # the staged manifest is written; moving the files in fails
        if str(dst) == str(outer / "metrics.json"):
            raise OSError("simulated failure of the move")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(GoldenError, match="committed but moving its files into place failed"):
        tx.commit({})
    monkeypatch.setattr(os, "replace", real_replace)
    tx.abort()
    assert tx.staging.is_dir(), "a decided commit must be left for recovery, not dropped"
    assert (outer / "NOTES.txt").read_text() == "mine"
    assert store.read_json(outer / "inner" / "metrics.json") == {"v": "inner"}
    with store.locked(outer):
        store.recover(outer)
    assert not tx.staging.exists()
    assert store.read_json(outer / "metrics.json") == {"v": 2}
    assert (outer / "NOTES.txt").read_text() == "mine"
    assert store.read_json(outer / "inner" / "metrics.json") == {"v": "inner"}
