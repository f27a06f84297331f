"""The package's public names: importable lazily, listed by ``dir()``, torch-free to import."""

from __future__ import annotations

import subprocess
import sys

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
