"""What is installed for a Python interpreter: its version and every package's version.

One short subprocess per interpreter (``importlib.metadata``, stdlib only), so that it works
for any environment, whatever it has installed; the cache of results keys runs by it, and
``compare --python-a/--python-b`` says what differs between two environments.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

_INSTALLED = (
    "import importlib.metadata as m, json, sys; print(json.dumps({'python': "
    "sys.version.split()[0], 'packages': sorted("
    "f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions())}))"
)
# Named in every environment difference, changed or not: what the numbers depend on most.
WATCHED = ("torch",)


@dataclasses.dataclass(frozen=True)
class Installed:
    """``python``'s version and its packages' ``name==version``, sorted."""

    python: str
    packages: tuple[str, ...]

    def versions(self) -> dict[str, str]:
        """``{normalized name: version}`` (``-``, ``_`` and ``.`` alike, lower case)."""
        pairs = (p.partition("==") for p in self.packages)
        return {_normalized(name): version for name, _, version in pairs}


def installed(python: str, timeout: float = 60) -> Installed:
    """What is installed for the interpreter ``python``; ``OSError``, ``ValueError`` or
    ``subprocess.SubprocessError`` when it cannot say (no such file, not a Python)."""
    done = subprocess.run(
        [python, "-c", _INSTALLED], capture_output=True, text=True, timeout=timeout, check=True
    )
    document = json.loads(done.stdout)
    return Installed(str(document["python"]), tuple(document["packages"]))


@dataclasses.dataclass(frozen=True)
class Difference:
    """What differs from environment A to B: ``changed`` ``{name: (a, b)}`` (Python's own
    version as ``python``), the packages only one side has, and the :data:`WATCHED` ones'
    versions on both sides (``None``: not installed)."""

    changed: dict[str, tuple[str, str]]
    only_a: dict[str, str]
    only_b: dict[str, str]
    watched: dict[str, tuple[str | None, str | None]]

    @property
    def same(self) -> bool:
        return not (self.changed or self.only_a or self.only_b)

    def to_json(self) -> dict[str, object]:
        return {
            "changed": {k: list(v) for k, v in self.changed.items()},
            "only_a": self.only_a,
            "only_b": self.only_b,
            "watched": {k: list(v) for k, v in self.watched.items()},
        }


def difference(a: Installed, b: Installed) -> Difference:
    """What changed from ``a`` to ``b``, by package name."""
    va, vb = a.versions(), b.versions()
    changed = {n: (va[n], vb[n]) for n in sorted(va.keys() & vb.keys()) if va[n] != vb[n]}
    if a.python != b.python:
        changed = {"python": (a.python, b.python), **changed}
    return Difference(
        changed,
        {n: va[n] for n in sorted(va.keys() - vb.keys())},
        {n: vb[n] for n in sorted(vb.keys() - va.keys())},
        {n: (va.get(n), vb.get(n)) for n in WATCHED},
    )


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return name.lower().replace("_", "-").replace(".", "-")
