"""Size bounds the package keeps: the core pytest plugin stays a core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_rollout_golden

PACKAGE = Path(pytest_rollout_golden.__file__).parent
CORE = PACKAGE / "_internal" / "pytest_plugin" / "golden_plugin.py"
# GoldenPlugin makes a test's golden and finishes it; a hook of one concern (collection, the
# summary, pruning, ...) belongs to that concern's plugin, registered only where it applies.
MAX_CORE_LINES = 250


def class_lines(source: str, name: str) -> int:
    """Lines of class ``name`` in ``source``, its decorators excluded, its last line included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            assert node.end_lineno is not None
            return node.end_lineno - node.lineno + 1
    raise LookupError(f"no class {name}")


def test_the_core_plugin_stays_under_its_bound():
    lines = class_lines(CORE.read_text(), "GoldenPlugin")
    assert lines < MAX_CORE_LINES, (
        f"GoldenPlugin has {lines} lines (bound {MAX_CORE_LINES}): move the hooks of one "
        "concern into that concern's plugin (see the *_plugin.py modules beside it)"
    )


def test_class_lines_counts_a_class_from_its_line_to_its_last():
    source = "x = 1\n\n\nclass A:\n    a = 1\n\n    def f(self):\n        return 2\n"
    assert class_lines(source, "A") == 5
