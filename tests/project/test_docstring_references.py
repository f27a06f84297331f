"""Every cross-reference in the package's docstrings and comments points at something.

A reference is a Sphinx role, ``:mod:`x```, ``:func:`x```, ``:class:`x```, ``:meth:`x``` or
``:attr:`x```. It is read from the source (the AST and the text), with no import, by these rules:

- ``~`` (show the last component only) is dropped;
- a name of another top-level package (``torch.Tensor``, ``pytest.Item``) resolves when that
  package is installed;
- any other name resolves when some definition in the package ends with it, dot by dot: a
  module (``pytest_rollout_golden.store.codec``), a top-level function, class or assignment
  of a module, or a method or attribute of a class; leading dots (``.diff.pair_paths``) only
  say "relative" and are dropped, as Sphinx's suffix search does;
- a bare name also resolves when the module that mentions it imports or defines it.

So a reference left behind by a move (``.presentation`` after the module was split) fails.
The check runs once on a planted stale reference, so it can be seen failing.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_rollout_golden"
NAME = PACKAGE.name

ROLE = re.compile(r":(?:py:)?(mod|func|class|meth|attr|data|exc|obj):`([^`]+)`")


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([NAME, *parts])


def _class_members(node: ast.ClassDef, prefix: str) -> Iterable[str]:
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield f"{prefix}.{item.name}"
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            yield f"{prefix}.{item.target.id}"
        elif isinstance(item, ast.Assign):
            yield from (f"{prefix}.{t.id}" for t in item.targets if isinstance(t, ast.Name))
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for sub in ast.walk(item):  # instance attributes: self.x = ...
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    yield f"{prefix}.{sub.attr}"


def _definitions(module: str, tree: ast.Module, is_package: bool) -> Iterable[str]:
    """The qualified names one module defines: itself, its top-level names, class members."""
    yield module
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{module}.{node.name}"
        elif isinstance(node, ast.ClassDef):
            yield f"{module}.{node.name}"
            yield from _class_members(node, f"{module}.{node.name}")
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                exported = ast.walk(node.value)  # a module's re-exports are in its __all__
                yield from (f"{module}.{c.value}" for c in exported if isinstance(c, ast.Constant))
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                yield from (f"{module}.{n.id}" for n in names if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield f"{module}.{node.target.id}"
    if is_package:  # re-exports: imported names, and lazy ones, which the package spells as strings
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                yield from (f"{module}.{a.asname or a.name}" for a in node.names)
            elif isinstance(node, ast.Constant) and str(node.value).isidentifier():
                yield f"{module}.{node.value}"


def _local_names(tree: ast.Module) -> set[str]:
    """Names a module binds anywhere (imports, definitions, assignments), for bare references."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _installed(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def stale_references(sources: Mapping[str, str]) -> list[str]:
    """``"path:line: :role:`target`"`` for every reference that resolves to nothing."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    defined = {
        d
        for path, tree in trees.items()
        for d in _definitions(_module_name(path), tree, path.endswith("__init__.py"))
    }
    suffixes = {d.split(".", i)[-1] for d in defined for i in range(d.count(".") + 1)}
    stale = []
    for path, text in sources.items():
        local = _local_names(trees[path])
        for match in ROLE.finditer(text):
            target = match.group(2).lstrip("~").strip().removesuffix("()")
            bare = target.lstrip(".")
            top = bare.split(".")[0]
            if (
                bare in suffixes
                or bare in defined
                or ("." not in target and bare in local)
                or (top != NAME and not target.startswith(".") and _installed(top))
            ):
                continue
            line = text.count("\n", 0, match.start()) + 1
            stale.append(f"{path}:{line}: {match.group(0)}")
    return stale


def read_sources(package: Path = PACKAGE) -> dict[str, str]:
    """``{path in the package: source}`` of every module."""
    return {p.relative_to(package).as_posix(): p.read_text() for p in sorted(package.rglob("*.py"))}


def test_every_docstring_reference_resolves():
    stale = stale_references(read_sources())
    assert not stale, "references to nothing (renamed or moved?):\n" + "\n".join(stale)


@pytest.mark.parametrize(
    "reference",
    [
        ":mod:`~.presentation`",
        ":func:`.calibrate.write_lane`",
        ":class:`NoSuchClass`",
        ":meth:`pytest_rollout_golden.store.codec.no_such_function`",
    ],
)
def test_a_planted_stale_reference_is_found(reference):
    sources = read_sources()
    before = set(stale_references(sources))
    path = "store/codec.py"
    sources[path] = f'"""See {reference}."""\n' + sources[path]
    assert set(stale_references(sources)) - before == {f"{path}:1: {reference}"}


def test_references_that_exist_pass():
    sources = {
        "a.py": '"""See :func:`b.helper`, :class:`~.b.Thing`, :meth:`.Thing.run`, :mod:`.b`."""\n'
        "from .b import Thing\n",
        "b.py": "def helper(): ...\nclass Thing:\n    def run(self): ...\n",
        "c.py": '"""Bare names the module binds: :class:`Path`, :func:`local`."""\n'
        "from pathlib import Path\ndef local(): ...\n",
    }
    assert stale_references(sources) == []
