"""Unit tests of location.py: golden directories of tests, safe names, and the way back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pytest_rollout_golden.store import location
from pytest_rollout_golden.store.location import golden_dir, owning_test_files, safe_name

ROOTDIR = Path("/repo")
ROOT = ROOTDIR / "golden"


def where(test_file: str, name: str, key: str | None = None) -> str:
    path = golden_dir(ROOT, ROOTDIR, ROOTDIR / test_file, name, key=key)
    return str(path.relative_to(ROOT))


def test_directory_mirrors_the_test_file_and_name():
    assert where("tests/test_ppo.py", "test_loss") == "tests/test_ppo/test_loss"
    assert where("tests/test_ppo.py", "TestPPO::test_loss") == "tests/test_ppo/TestPPO/test_loss"
    assert where("tests/test_ppo.py", "test_loss[bf16-2]") == "tests/test_ppo/test_loss[bf16-2]"
    assert where("tests/test_ppo.py", "test_loss[0.5]") == "tests/test_ppo/test_loss[0.5]"


def test_key_replaces_the_test_name_within_the_file():
    assert where("tests/test_ppo.py", "test_a[x]", key="layouts") == "tests/test_ppo/layouts"
    assert where("tests/test_ppo.py", "Cls::test_b", key="layouts") == "tests/test_ppo/layouts"
    assert where("tests/other.py", "test_a", key="layouts") == "tests/other/layouts"


@pytest.mark.parametrize(
    "name",
    ["test_x[a/b]", "test_x[a b]", "test_x[../..]", "test_x[é]", "..", ".hidden", "", "x" * 300],
)
def test_unsafe_names_stay_one_component_inside_the_root(name):
    component = safe_name(name)
    assert "/" not in component and "\\" not in component
    assert not component.startswith(".") and component not in ("", "..")
    assert len(component) <= 120
    path = golden_dir(ROOT, ROOTDIR, ROOTDIR / "tests/test_x.py", name)
    assert path.parent == ROOT / "tests" / "test_x"


def test_distinct_names_never_share_a_directory():
    names = ["test_x[a/b]", "test_x[a_b]", "test_x[a b]", "test_x[a:b]", "test_x[a?b]",
             "A" * 150, "A" * 151, "test_x[é]", "test_x[è]"]  # fmt: skip
    components = [safe_name(n) for n in names]
    assert len(set(components)) == len(names)
    assert safe_name("test_x[a_b]") == "test_x[a_b]", "safe names are kept as they are"


def test_strict_names_are_file_name_safe():
    assert safe_name("actor/log_probs", strict=True) != safe_name("actor_log_probs", strict=True)
    assert safe_name("log_probs", strict=True) == "log_probs"
    assert set(safe_name("a.b[c]", strict=True).split("~")[0]) <= set("abc_")


def test_test_files_outside_the_rootdir_go_under_external():
    path = golden_dir(ROOT, ROOTDIR, Path("/elsewhere/tests/test_x.py"), "test_y")
    assert path == ROOT / "_external" / "elsewhere" / "tests" / "test_x" / "test_y"


def test_owning_test_files_inverts_golden_dir(tmp_path):
    rootdir, root = tmp_path, tmp_path / "golden"
    test_file = rootdir / "tests" / "test_ppo.py"
    test_file.parent.mkdir()
    test_file.write_text("")
    for name, key in [("test_a", None), ("Cls::test_b[1-2]", None), ("test_c", "shared")]:
        directory = golden_dir(root, rootdir, test_file, name, key=key)
        assert owning_test_files(root, rootdir, directory) == [test_file]
    gone = golden_dir(root, rootdir, rootdir / "tests" / "test_gone.py", "test_a")
    assert owning_test_files(root, rootdir, gone) == []


@pytest.mark.parametrize(
    "relative", ["tests/rl+ppo/test_x.py", "tests/test_v1.2.py", "my tests/test_ä.py", "test_x.py"]
)
def test_owning_test_files_of_names_that_had_to_change(tmp_path, relative):
    rootdir, root = tmp_path, tmp_path / "golden"
    test_file = rootdir / relative
    test_file.parent.mkdir(parents=True, exist_ok=True)
    test_file.write_text("")
    directory = golden_dir(root, rootdir, test_file, "TestA::test_b[x/y]")
    assert owning_test_files(root, rootdir, directory) == [test_file]


def test_owning_test_files_of_every_kind_at_the_deepest_level(tmp_path):
    rootdir, root = tmp_path, tmp_path / "golden"
    (rootdir / "docs" / "guide").mkdir(parents=True)
    for name in ("docs/guide.md", "docs/guide.py", "docs/guide/intro.rst", "docs/notes.txt"):
        (rootdir / name).write_text("")
    guide = golden_dir(root, rootdir, rootdir / "docs" / "guide.md", "guide.md")
    assert owning_test_files(root, rootdir, guide) == [
        rootdir / "docs" / "guide.md",
        rootdir / "docs" / "guide.py",
    ]
    nested = golden_dir(root, rootdir, rootdir / "docs" / "guide" / "intro.rst", "intro.rst")
    assert owning_test_files(root, rootdir, nested) == [rootdir / "docs" / "guide" / "intro.rst"]
    (rootdir / "docs" / "guide" / "intro.rst").unlink()  # nearer the root: guide.md, guide.py
    assert len(owning_test_files(root, rootdir, nested)) == 2


def test_owning_test_files_outside_the_rootdir(tmp_path):
    rootdir, root = tmp_path / "repo", tmp_path / "repo" / "golden"
    test_file = tmp_path / "shared tests" / "test_x.py"
    test_file.parent.mkdir(parents=True)
    test_file.write_text("")
    directory = golden_dir(root, rootdir, test_file, "test_y")
    assert directory.relative_to(root).parts[0] == "_external"
    assert owning_test_files(root, rootdir, directory) == [test_file]


def test_shared_goldens_cannot_collide_with_test_file_goldens(tmp_path):
    root = tmp_path / "golden"
    shared = location.shared_golden_dir(root, "policy/../x")
    assert shared.parent == root / "@shared" and shared.name != ".."
    for name in ("@shared.py", "sub/@shared.py"):
        directory = location.golden_dir(root, tmp_path, tmp_path / name, "test_x")
        assert root / "@shared" not in (directory, *directory.parents)
        assert shared not in directory.parents and directory not in shared.parents


def test_names_beside_a_golden_round_trip_through_the_staging_parser(tmp_path):
    directory = tmp_path / "test_x" / "layout.new-ref"
    staging = location.staging_dir(directory)
    lock, tmp = location.lock_path(directory), location.temp_file(directory / location.MANIFEST)
    assert staging.parent == lock.parent == directory.parent
    assert location.staged_golden(staging.name) == "layout.new-ref"  # not "layout": no prefix
    for other in (lock.name, tmp.name, directory.name, location.MANIFEST, ".layout.new-x"):
        assert location.staged_golden(other) is None, other
    # hidden, so that a scan of the golden root never takes them for goldens
    staging.mkdir(parents=True)
    (staging / location.MANIFEST).write_text("{}")
    assert all(p.name.startswith(".") for p in (staging, lock, tmp))
    assert location.find_goldens(tmp_path) == []
    directory.mkdir()
    (directory / location.MANIFEST).write_text("{}")
    assert location.find_goldens(tmp_path) == [directory]


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


# a whole constant, or the piece of an f-string that builds a name (``f".{name}.lock"``)
ON_DISK = re.compile(
    r"(manifest|metrics|tolerances)\.json|rollout-|tensors-|-step|\.(new|old|tmp)-|\.lock"
)


def test_every_on_disk_name_is_spelled_only_in_location():
    package = Path(location.__file__).parents[1]  # the whole package, not only store/
    modules = [p for p in package.rglob("*.py") if p.name != "location.py"]
    assert len(modules) > 20
    spelled = {
        f"{p.relative_to(package)}: {s!r}"
        for p in modules
        for s in _code_strings(p)
        if ON_DISK.fullmatch(s)  # a text that mentions a file is not a name
    }
    assert not spelled, "use the names of location.py"
