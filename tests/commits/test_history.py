"""The history the commit tools are tested on is what their tests assume."""

from __future__ import annotations

from history import build_history, git, tree_digest


def test_history_holds_goldens_at_the_good_end_and_the_bug_at_its_commit(tmp_path) -> None:
    history = build_history(tmp_path / "repo", commits=6, bug_at=3, broken_at=1, dirty=True)
    repo = history.repo
    assert len(history.shas) == len(set(history.shas)) == 6
    assert git(repo, "rev-parse", "HEAD") == history.bad
    committed = git(repo, "ls-tree", "-r", "--name-only", history.good, "golden")
    assert committed.endswith("metrics.json") and "manifest.json" in committed
    changed = git(repo, "show", "--format=", "--name-only", history.shas[3]).split()
    assert changed == ["calc.py", "notes.txt"]
    assert "SCALE = 1.0 + 0.001" in git(repo, "show", f"{history.shas[3]}:calc.py")
    assert "def broken(:" in git(repo, "show", f"{history.shas[1]}:test_calc.py")
    assert "def broken(:" not in git(repo, "show", f"{history.shas[2]}:test_calc.py")
    assert history.subjects[3] == git(repo, "log", "-1", "--format=%s", history.shas[3])
    status = git(repo, "status", "--porcelain", "--untracked-files=all")
    assert [line.strip() for line in status.splitlines()] == [
        "M calc.py",
        "?? golden/untracked/note.txt",
    ]


def test_the_same_history_twice_has_the_same_shas(tmp_path) -> None:
    one = build_history(tmp_path / "one", commits=3, bug_at=2)
    two = build_history(tmp_path / "two", commits=3, bug_at=2)
    assert one.shas == two.shas


def test_tree_digest_sees_a_changed_byte_and_a_new_file(tmp_path) -> None:
    (tmp_path / "a").write_text("x")
    before = tree_digest(tmp_path)
    (tmp_path / "a").write_text("y")
    assert tree_digest(tmp_path) != before
    (tmp_path / "b").mkdir()
    assert "b" in tree_digest(tmp_path)
