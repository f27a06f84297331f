"""Package attributes imported on first use, so that importing a package stays light."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(
    package: str, names: Mapping[str, str], submodules: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``.

    ``names`` maps a public name to the submodule that defines it; ``submodules`` are
    importable as attributes. ``dir()`` lists both with the names already loaded.
    """
    submodules = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(import_module(f".{names[name]}", package), name)
        if name in submodules:
            return import_module(f".{name}", package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        import sys

        return sorted({*vars(sys.modules[package]), *names, *submodules})

    return __getattr__, __dir__
