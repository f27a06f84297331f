"""The package's public names: importable lazily, listed by ``dir()``, torch-free to import."""

from __future__ import annotations

import ast
import subprocess
import sys
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
    "location", "store", "results", "presentation", "modes", "golden_files", "options",
    "markers", "prune", "session", "tolerance", "plugin", "cli", "checks", "replay", "calibrate",
    "mismatch_bounds",
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
    package = Path(__file__).parents[1] / "pytest_rollout_golden"
    uses = {str(p.relative_to(package)): _private_uses(p) for p in package.rglob("*.py")}
    assert {p: u for p, u in uses.items() if u} == {}
    planted = tmp_path / "planted.py"  # control: the check sees both kinds of reach
    planted.write_text("from . import codec\nfrom .store import _x\ncodec._is_torch_tensor(1)\n")
    assert _private_uses(planted) == [
        "from .store import _x",
        "line 3: codec._is_torch_tensor",
    ]
