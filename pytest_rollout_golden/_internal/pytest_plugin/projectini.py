"""The pytest configuration of the project a command runs in, found as pytest finds it.

Used by ``rollout-golden`` outside pytest, so that ``golden_tolerances`` and
``golden_ignore`` apply as they do in the plugin. Reads the files directly
(``configparser``, ``tomllib``) instead of starting pytest's configuration.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...errors import GoldenError

# In the order pytest tries them in each folder, with the section that holds the options.
_CANDIDATES = (
    ("pytest.toml", "toml", ("pytest",), True),
    (".pytest.toml", "toml", ("pytest",), True),
    ("pytest.ini", "ini", ("pytest",), True),
    (".pytest.ini", "ini", ("pytest",), True),
    ("pyproject.toml", "toml", ("tool", "pytest", "ini_options"), False),
    ("tox.ini", "ini", ("pytest",), False),
    ("setup.cfg", "ini", ("tool:pytest",), False),
)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{path}: cannot be read as TOML ({exc})") from None


def _section(path: Path, kind: str, keys: tuple[str, ...]) -> Mapping[str, Any] | None:
    if kind == "toml":
        node: Any = _read_toml(path)
        if keys[:2] == ("tool", "pytest") and isinstance(node.get("tool", {}).get("pytest"), dict):
            native = node["tool"]["pytest"]
            if "ini_options" not in native and native:
                return native  # pytest 9's native [tool.pytest] table
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error) as exc:
        raise GoldenError(f"{path}: cannot be read as an ini file ({exc})") from None
    return dict(parser[keys[0]]) if parser.has_section(keys[0]) else None


def find_config(paths: Iterable[Path]) -> tuple[Path | None, Mapping[str, Any]]:
    """``(config file, its pytest options)`` for the first path whose folders hold one.

    Each path and its parents are searched the way pytest searches its
    arguments; ``(None, {})`` when there is no pytest configuration.
    """
    for arg in paths:
        start = Path(os.path.abspath(arg))
        for base in (start, *start.parents):
            for name, kind, keys, always in _CANDIDATES:
                path = base / name
                if path.is_file():
                    options = _section(path, kind, keys)
                    if options is not None or always:
                        return path, options or {}
    return None, {}


def linelist(value: Any) -> list[str]:
    """An ini ``linelist`` option as pytest reads it: one entry per non-empty line."""
    if value is None:
        return []
    if isinstance(value, str):
        return [line.strip() for line in value.splitlines() if line.strip()]
    return [str(v).strip() for v in value if str(v).strip()]
