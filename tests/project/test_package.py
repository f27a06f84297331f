"""The package's public names: importable lazily, listed by ``dir()``, torch-free to import."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("package", "names"),
    [
        ("pytest_rollout_golden", ["Golden", "save_batch", "deterministic", "parallel"]),
        ("pytest_rollout_golden.parallel", ["variants", "launch", "Layout", "dp_shards"]),
    ],
)
def test_lazy_names_are_listed_and_importing_the_package_loads_no_torch(package, names):
    code = (
        f"import sys, {package} as p\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'\n"
        f"missing = [n for n in {names!r} if n not in dir(p)]\n"
        "assert not missing, missing\n"
        f"assert all(getattr(p, n) is not None for n in {names!r})\n"
        "try:\n    p.no_such_name\nexcept AttributeError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"module {package!r} has no attribute 'no_such_name'"


# The core that decides and reports: what the plugin, the CLI and a replayed golden's
# bookkeeping need before any tensor is read.
TORCH_FREE = [
    "plugin", "cli", "store", "store.location",
    "_internal.results", "_internal.golden.modes", "_internal.golden.golden_files",
    "_internal.golden.checks", "_internal.golden.golden", "_internal.golden.lanes",
    "_internal.wording", "_internal.golden.messages", "_internal.pytest_plugin.summary",
    "_internal.tolerance.stack", "_internal.tolerance.calibration",
    "_internal.tolerance.mismatch_bounds",
    "_internal.pytest_plugin.options", "_internal.pytest_plugin.flags",
    "_internal.pytest_plugin.markers", "_internal.pytest_plugin.prune",
    "_internal.pytest_plugin.session", "_internal.pytest_plugin.golden_plugin",
    "_internal.pytest_plugin.calibrate_plugin", "_internal.pytest_plugin.prune_plugin",
    "_internal.pytest_plugin.rank_plugin", "_internal.pytest_plugin.xdist_plugin",
    "_internal.pytest_plugin.settings_plugin", "_internal.pytest_plugin.collection_plugin",
    "_internal.pytest_plugin.failure_plugin", "_internal.pytest_plugin.summary_plugin",
    "_internal.pytest_plugin.report_plugin", "_internal.pytest_plugin.plot_plugin",
    "_internal.pytest_plugin.worker_plugin", "_internal.pytest_plugin.unused",
    "_internal.pytest_plugin.invocation",
]  # fmt: skip


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_core_modules_import_no_torch_or_numpy(module):
    code = (
        f"import sys, pytest_rollout_golden.{module}\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _private_uses(path: Path) -> list[str]:
    """``module._name`` and ``from .module import _name`` in one module of the package."""
    tree = ast.parse(path.read_text())
    imported, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {'.' * node.level}{node.module or ''} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_into_the_private_names_of_another(tmp_path):
    package = Path(__file__).parents[2] / "pytest_rollout_golden"
    uses = {str(p.relative_to(package)): _private_uses(p) for p in package.rglob("*.py")}
    assert {p: u for p, u in uses.items() if u} == {}
    planted = tmp_path / "planted.py"  # control: the check sees both kinds of reach
    planted.write_text("from . import codec\nfrom .store import _x\ncodec._is_torch_tensor(1)\n")
    assert _private_uses(planted) == [
        "from .store import _x",
        "line 3: codec._is_torch_tensor",
    ]


PACKAGE = Path(__file__).parents[2] / "pytest_rollout_golden"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imports(module: str, path: Path, names: Mapping[str, Path]) -> set[str]:
    """The package modules ``module`` imports anywhere: at the top, in functions and under
    ``TYPE_CHECKING`` alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: None if path.name == "__init__.py" else -1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in names else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in names and name != module}


def _cycles(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_modules_import_each_other_in_one_direction_only():
    names = _module_names()
    graph = {m: _imports(m, p, names) for m, p in names.items()}
    assert _cycles(graph) == []
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}  # control
    assert _cycles(planted) == [{"a", "b", "c"}]
