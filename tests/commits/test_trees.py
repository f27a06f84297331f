"""The git side of comparing commits: refs, ranges, the temporary checkouts, their cleanup
and the goldens installed into them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from history import tree_digest
from tinyrepo import CALC, TinyRepo

from pytest_rollout_golden._internal.commits import git, goldens, trees
from pytest_rollout_golden.errors import GoldenError


@pytest.fixture
def repo(tmp_path):
    tiny = TinyRepo(tmp_path / "project")
    for i in range(3):
        tiny.commit(f"note {i}", {f"notes/{i}.txt": str(i)})
    return tiny


def test_between_lists_the_range_oldest_first_bad_last(repo):
    commits = git.between(repo.path, repo.shas[0], "main")
    assert [c.sha for c in commits] == repo.shas[1:]
    assert [c.subject for c in commits] == ["note 0", "note 1", "note 2"]
    assert git.resolve(repo.path, "main~1") == commits[-2]


def test_refs_that_do_not_name_a_range_are_errors_naming_them(repo):
    with pytest.raises(GoldenError, match=r"nosuch: no such commit in .*git log --oneline"):
        git.resolve(repo.path, "nosuch")
    with pytest.raises(GoldenError, match=r"is not an ancestor of .*older commit"):
        git.between(repo.path, "main", repo.shas[0])
    with pytest.raises(GoldenError, match="not a git ref"):
        git.resolve(repo.path, "--all")


def test_a_tree_holds_the_commit_and_the_checkout_is_never_written(repo, tmp_path):
    (repo.path / "calc.py").write_text(CALC.format(scale=3.0))  # uncommitted
    (repo.path / "untracked.txt").write_text("mine")
    before = tree_digest(repo.path)
    with trees.Trees(repo.path, base=tmp_path) as run:
        tree = run.add(git.resolve(repo.path, repo.shas[1]))
        assert (tree.path / "calc.py").read_text() == CALC.format(scale=1.0)
        assert (tree.path / "notes" / "0.txt").read_text() == "0"
        assert not (tree.path / "notes" / "1.txt").exists()
        assert not (tree.path / "untracked.txt").exists()
        assert (run.folder / trees.MARKER).read_text() == trees.MARKER_TEXT
        assert trees.reap(run.folder.parent) == []  # locked: live, to this process too
        folder = run.folder
        run.remove(tree)
        assert not tree.path.exists()
    assert not folder.exists()
    assert tree_digest(repo.path) == before


def test_leaving_on_an_exception_removes_the_run_folder(repo, tmp_path):
    with pytest.raises(KeyboardInterrupt), trees.Trees(repo.path, base=tmp_path) as run:
        run.add(git.resolve(repo.path, "main"))
        folder = run.folder
        raise KeyboardInterrupt
    assert not folder.exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# A run of another process: it enters a run folder, says where, and stays until its stdin ends.
_OTHER_RUN = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from pytest_rollout_golden._internal.commits import trees
with trees.Trees(Path(sys.argv[1]), base=Path(sys.argv[2])) as run:
    print(run.folder, flush=True)
    sys.stdin.read()
"""


def _other_run(repo, base) -> tuple[subprocess.Popen, Path]:
    """A live run folder of another process, with that process."""
    package = Path(trees.__file__).parents[3]
    run = subprocess.Popen(
        [sys.executable, "-c", _OTHER_RUN, str(repo.path), str(base), str(package)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return run, Path(run.stdout.readline().strip())


def _as_if_in_another_pid_namespace(folder: Path) -> None:
    """What a run folder of a process in another PID namespace (a container sharing TMPDIR
    and uid) looks like from here: every pid it names is dead, or another process."""
    owner = {"pid": _dead_pid(), "start": "in another pid namespace"}
    (folder / "owner.json").write_text(json.dumps(owner))


def _leftover(root, name, owner) -> Path:
    folder = root / name
    (folder / "tree").mkdir(parents=True)
    (folder / "tree" / "file").write_text("x")
    if owner is not None:
        (folder / "owner.json").write_text(json.dumps(owner))
    return folder


def test_reap_removes_only_unlocked_run_folders_whatever_pids_they_name(repo, tmp_path):
    """Whether a run lives is the lock on its marker, which the kernel holds for the run's
    process in any PID namespace and releases when it dies, never a name or a pid."""
    root = trees.root(tmp_path)
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    live, live_folder = _other_run(repo, tmp_path)
    killed, stale = _other_run(repo, tmp_path)
    killed.kill()
    killed.wait()
    for folder in (live_folder, stale):
        _as_if_in_another_pid_namespace(folder)
    dead = {"pid": _dead_pid(), "start": "whenever"}
    ownerless = _leftover(root, "run-1-aa", dead)  # named and owned as a run; no marker
    stranger = _leftover(root, "other-5-ee", dead)
    outside = _leftover(tmp_path, "run-6-ff", dead)
    (root / "run-7-aa").symlink_to(outside)
    (stale / "link").symlink_to(outside)  # inside a folder to remove: removed, not followed
    try:
        assert trees.reap(root) == [stale]
        assert (live_folder / "clone" / ".git").is_dir()
    finally:
        live.communicate("")
    assert not stale.exists() and not live_folder.exists()  # the live run removed its own
    for kept in (ownerless, stranger, outside, root / "run-7-aa"):
        assert (kept / "tree" / "file").read_text() == "x"


def test_the_root_refuses_a_symlink_or_a_foreign_folder(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / f"rollout-golden-commits-{os.getuid()}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(GoldenError, match="not a folder"):
        trees.root(tmp_path)


def test_goldens_from_a_folder_include_uncommitted_files(repo, tmp_path):
    repo.record()
    (repo.path / "golden" / "extra.txt").write_text("uncommitted")
    source = goldens.GoldenSource.directory(repo.path / "golden")
    with trees.Trees(repo.path, base=tmp_path) as run:
        tree = run.add(git.resolve(repo.path, repo.shas[0]))  # before the goldens
        installed = goldens.install(source, tree.path, "golden")
        assert (installed / "extra.txt").read_text() == "uncommitted"
        assert (installed / "test_calc" / "test_loss" / "manifest.json").is_file()
    before = goldens.digest(source)
    (repo.path / "golden" / "extra.txt").write_text("changed")
    assert goldens.digest(source) != before


def test_goldens_from_a_ref_are_the_committed_ones(repo, tmp_path):
    repo.record()
    (repo.path / "golden" / "extra.txt").write_text("uncommitted")
    source = goldens.GoldenSource.committed(repo.path, "main", "golden")
    with trees.Trees(repo.path, base=tmp_path) as run:
        tree = run.add(git.resolve(repo.path, repo.shas[0]))
        installed = goldens.install(source, tree.path, "golden")
        assert not (installed / "extra.txt").exists()
        assert (installed / "test_calc" / "test_loss" / "manifest.json").is_file()
    assert goldens.digest(source).startswith("git:")
    with pytest.raises(GoldenError, match=r"golden: not committed at main~1 .*--goldens"):
        goldens.GoldenSource.committed(repo.path, "main~1", "golden")


def test_the_digest_follows_a_linked_golden_as_the_copy_does(tmp_path):
    (tmp_path / "elsewhere" / "g").mkdir(parents=True)
    (tmp_path / "elsewhere" / "g" / "metrics.json").write_text("1")
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "g").symlink_to(tmp_path / "elsewhere" / "g")
    source = goldens.GoldenSource.directory(tmp_path / "golden")
    before = goldens.digest(source)
    (tmp_path / "elsewhere" / "g" / "metrics.json").write_text("2")
    assert goldens.digest(source) != before


@pytest.mark.parametrize("golden_rel", ["linked/golden", "../outside/golden", "/abs/golden"])
def test_install_never_removes_a_folder_outside_the_temporary_tree(tmp_path, golden_rel):
    """A golden path that leaves the tree, through ``..``, an absolute path or a symlink the
    commit holds, is refused; the folder it would have replaced is untouched."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (outside / "golden").mkdir(parents=True)
    (outside / "golden" / "keep.txt").write_text("the user's")
    tree.mkdir()
    (tree / "linked").symlink_to(outside)
    source_dir = tmp_path / "src"
    (source_dir / "x").mkdir(parents=True)
    source = goldens.GoldenSource.directory(source_dir)
    with pytest.raises(GoldenError, match="outside the temporary checkout"):
        goldens.install(source, tree, golden_rel.replace("/abs", str(tmp_path / "abs")))
    assert (outside / "golden" / "keep.txt").read_text() == "the user's"
