"""docs/architecture.md against the code: its module table lists every module of the package
and no other, and the imports between modules keep the rules the page states.

Imports are read from the source (the AST), at module level and inside functions, relative
and absolute; ``importlib.import_module`` strings (the lazy attributes of the packages) are
not imports here. Each check also runs once on a planted violation, so a check that can no
longer fail is caught too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_rollout_golden"
PAGE = ROOT / "docs" / "architecture.md"

IMPORTS_ONLY = "imports only"  # of the package's modules; anything outside the package is free
NEVER_IMPORTS = "never imports"
IMPORTED_ONLY_BY = "is imported only by"

# The import rules, as docs/architecture.md states them (its "Import rules" table; the page
# says why). A module is its path in the package ("store/codec.py"), a folder ("store/") is
# every module in it, and a name without "/" or ".py" is a library outside the package
# (``_pytest``: pytest's internals). Besides these: no import cycle among the modules.
RULES: list[tuple[str, str, tuple[str, ...]]] = [
    # modules                   rule              of the package's modules (or a library)
    ("errors.py",               IMPORTS_ONLY,     ()),
    ("store/location.py",       IMPORTS_ONLY,     ()),
    ("store/",                  IMPORTS_ONLY,     ("store/", "errors.py")),
    ("reference/",              IMPORTS_ONLY,     ("reference/",)),
    ("parallel/",               IMPORTS_ONLY,     ("parallel/", "reference/", "_internal/lazy.py")),
    ("dumps/",                  IMPORTS_ONLY,     ("dumps/", "store/", "errors.py")),
    ("vllm_batch.py",           IMPORTS_ONLY,     ("store/", "_internal/rollout_rows.py")),
    ("sglang_batch.py",         IMPORTS_ONLY,     ("store/", "_internal/rollout_rows.py",
                                                   "vllm_batch.py")),
    ("_internal/tolerance/",    NEVER_IMPORTS,    ("_internal/golden/",
                                                   "_internal/pytest_plugin/")),
    ("_internal/report/",       NEVER_IMPORTS,    ("_internal/pytest_plugin/",)),
    ("_internal/pytest_plugin/", IMPORTED_ONLY_BY, ("plugin.py", "cli/",
                                                   "_internal/pytest_plugin/")),
    ("plugin.py",               IMPORTED_ONLY_BY, ()),
    ("cli/",                    IMPORTED_ONLY_BY, ("__main__.py", "cli/")),
    ("_pytest",                 IMPORTED_ONLY_BY, ("plugin.py", "_internal/pytest_plugin/")),
]  # fmt: skip


# The layers of ``_internal``, bottom first (docs/architecture.md, "Layers"): a module imports
# its own layer and those below, never one above, directly or through a module outside the
# layers (``golden/`` importing ``invariants/mismatch.py`` that imported ``report/`` is upward).
LAYERS: list[tuple[str, ...]] = [
    ("_internal/lazy.py", "_internal/version.py", "_internal/wording.py",
     "_internal/user_warnings.py", "_internal/rollout_rows.py",
     "_internal/hypothesis_profiles.py"),
    ("_internal/tolerance/",),
    ("_internal/results.py",),
    ("_internal/golden/",),
    ("_internal/report/",),
    ("_internal/commits/",),
    ("_internal/history/",),
    ("_internal/pytest_plugin/",),
]  # fmt: skip


# --------------------------------------------------------------------------- the code


def read_sources(package: Path = PACKAGE) -> dict[str, str]:
    """``{path in the package: source}`` of every module."""
    return {p.relative_to(package).as_posix(): p.read_text() for p in sorted(package.rglob("*.py"))}


def _dotted(path: str) -> str:
    """``store/codec.py`` -> ``store.codec``; ``store/__init__.py`` -> ``store``; the
    package's own ``__init__.py`` -> ``""``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: Mapping[str, str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(internal, external)``: per module, the package's modules it imports (by path), and
    the top-level names of the libraries it imports."""
    by_name = {_dotted(path): path for path in sources}
    internal: dict[str, set[str]] = {path: set() for path in sources}
    external: dict[str, set[str]] = {path: set() for path in sources}
    top = PACKAGE.name
    for path, source in sources.items():
        parts = [p for p in _dotted(path).split(".") if p]
        package = parts if path.endswith("__init__.py") else parts[:-1]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    module = ".".join([top, *base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets = [(module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in targets:
                if module != top and not module.startswith(top + "."):
                    external[path].add(module.split(".")[0])
                    continue
                dotted = module.removeprefix(top).removeprefix(".")
                submodule = f"{dotted}.{name}".lstrip(".") if name else None
                target = by_name.get(submodule) if submodule else None
                internal[path].add(target or by_name[dotted])
    return internal, external


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one
    module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern) if pattern.endswith("/") else name == pattern


def _any(name: str, patterns: Iterable[str]) -> bool:
    return any(_matches(name, p) for p in patterns)


def _is_library(pattern: str) -> bool:
    return not pattern.endswith(("/", ".py"))


def violations(
    rules: Iterable[tuple[str, str, tuple[str, ...]]],
    internal: Mapping[str, set[str]],
    external: Mapping[str, set[str]],
) -> list[str]:
    """Every import that breaks one of ``rules``, as ``importer -> imported: rule``."""
    found = []
    for subject, rule, objects in rules:
        said = f"{subject} {rule} {', '.join(objects) or 'nothing of the package'}"
        for importer in sorted(internal):
            imported = sorted(internal[importer] - {importer})
            if rule == IMPORTS_ONLY and _matches(importer, subject):
                bad = [t for t in imported if not _any(t, objects)]
            elif rule == NEVER_IMPORTS and _matches(importer, subject):
                bad = [t for t in imported if _any(t, objects)]
            elif rule == IMPORTED_ONLY_BY and not _any(importer, objects):
                pool = sorted(external[importer]) if _is_library(subject) else imported
                bad = [t for t in pool if (t == subject) or _matches(t, subject)]
            else:
                bad = []
            found += [f"{importer} -> {t}: {said}" for t in bad]
    return found


# The public modules that use every layer; every other public module sits beside layer 1 and
# reaches no module above it.
TOP = ("plugin.py", "cli/", "__init__.py", "__main__.py")
BESIDE = 1


def _layer(module: str, layers: list[tuple[str, ...]]) -> int | None:
    return next((i for i, members in enumerate(layers) if _any(module, members)), None)


def _own_layer(module: str, layers: list[tuple[str, ...]]) -> int | None:
    """The layer ``module`` imports from: its own, :data:`BESIDE` for a public module below
    the top, ``None`` for the top."""
    if module.startswith("_internal/"):
        return _layer(module, layers)
    return None if _any(module, TOP) else BESIDE


def layer_violations(layers: list[tuple[str, ...]], internal: Mapping[str, set[str]]) -> list[str]:
    """Every import that reaches a layer above the importer's (:func:`_own_layer`): a layered
    module's directly or through public modules, a public module's directly; as
    ``importer -> ... -> imported: layer i imports layer j``."""
    found = []
    for start in sorted(internal):
        own = _own_layer(start, layers)
        if own is None:
            continue
        todo = [(t, (start, t)) for t in sorted(internal[start] - {start})]
        seen: set[str] = set()
        while todo:
            module, path = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            layer = _layer(module, layers)
            if layer is None:  # a public module: followed from a layered one (it checks itself)
                if start.startswith("_internal/"):
                    todo += [(t, (*path, t)) for t in sorted(internal[module])]
            elif layer > own:
                found.append(f"{' -> '.join(path)}: layer {own} imports layer {layer}")
    return found


def test_every_import_keeps_the_rules():
    internal, external = import_graph(read_sources())
    assert len(internal) > 80 and internal["cli/__init__.py"], "the import graph is not read"
    assert violations(RULES, internal, external) == []


def test_no_layer_imports_a_layer_above():
    internal, _ = import_graph(read_sources())
    unlayered = [m for m in internal if m.startswith("_internal/") and _layer(m, LAYERS) is None]
    assert unlayered == ["_internal/__init__.py"]  # the package's docstring only
    assert layer_violations(LAYERS, internal) == []


@pytest.mark.parametrize(
    ("module", "line", "through"),
    [
        ("_internal/tolerance/spec.py", "from ..results import Comparison", ()),
        ("_internal/golden/keyed.py", "from ..report import stats", ()),
        ("_internal/report/stats.py", "from ..commits import git", ()),
        ("_internal/wording.py", "from .tolerance import spec", ()),
        ("_internal/golden/keyed.py", "from ... import strategies", ("strategies.py",)),
        ("invariants/kl.py", "from .._internal.golden import keyed", ()),
        ("mismatch.py", "from ._internal.results import Comparison", ()),
    ],
)
def test_a_planted_upward_import_is_found(module, line, through):
    sources = read_sources()
    if through:  # the public module in between imports upward
        sources[through[0]] += "\nfrom ._internal.commits import git\n"
    internal, _ = import_graph({**sources, module: sources[module] + f"\n{line}\n"})
    found = layer_violations(LAYERS, internal)
    if through:  # found from the planted module through the public one, and at the public one
        assert any(f.startswith(f"{module} -> {through[0]} -> ") for f in found), found
        assert all(f.startswith((module, through[0])) for f in found), found
    else:
        assert found and all(f.startswith(f"{module} -> ") for f in found), found


def test_no_import_cycles():
    internal, _ = import_graph(read_sources())
    assert cycles(internal) == []


# A planted import per rule (module, line), and the violation it must cause.
PLANTED = {
    "errors.py": ("errors.py", "from .store import location"),
    "store/location.py": ("store/location.py", "from . import disk"),
    "store/": ("store/codec.py", "from .._internal.report import stats"),
    "reference/": ("reference/losses.py", "from ..invariants import comparison"),
    "parallel/": ("parallel/moe.py", "from ..store import codec"),
    "dumps/": ("dumps/verl.py", "from .._internal.golden import files"),
    "vllm_batch.py": ("vllm_batch.py", "from .mismatch import sampled_log_probs"),
    "sglang_batch.py": ("sglang_batch.py", "from .mismatch import sampled_log_probs"),
    "_internal/tolerance/": ("_internal/tolerance/spec.py", "from ..golden import modes"),
    "_internal/report/": ("_internal/report/stats.py", "from ..pytest_plugin import options"),
    "_internal/pytest_plugin/": ("_internal/golden/golden.py", "from ..pytest_plugin import prune"),
    "plugin.py": ("cli/verify.py", "from ..plugin import pytest_configure"),
    "cli/": ("dumps/convert.py", "from .. import cli"),
    "_pytest": ("_internal/golden/variants.py", "from _pytest.mark import ParameterSet"),
}  # fmt: skip


def test_every_rule_has_a_planted_violation():
    assert sorted(PLANTED) == sorted(subject for subject, _, _ in RULES)


@pytest.mark.parametrize(("subject", "rule", "objects"), RULES, ids=[r[0] for r in RULES])
def test_a_planted_import_breaks_its_rule(subject, rule, objects):
    sources = read_sources()
    module, line = PLANTED[subject]
    internal, external = import_graph({**sources, module: sources[module] + f"\n{line}\n"})
    found = violations([(subject, rule, objects)], internal, external)
    assert len(found) == 1 and found[0].startswith(f"{module} -> "), found


def test_a_planted_cycle_is_found():
    sources = read_sources()
    planted = {**sources, "errors.py": sources["errors.py"] + "\nfrom . import cli\n"}
    found = cycles(import_graph(planted)[0])
    assert found and all("errors.py" in c and "cli/__init__.py" in c for c in found), found


def test_an_import_inside_a_function_counts():
    sources = read_sources()
    planted = sources["errors.py"] + "\ndef f():\n    from .store import codec\n"
    internal, _ = import_graph({**sources, "errors.py": planted})
    assert "store/codec.py" in internal["errors.py"]


# --------------------------------------------------------------------------- the page


def _section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section of the page, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _rows(section: str) -> list[tuple[str, list[str]]]:
    """``(### heading above it, cells)`` of every table row but the header and its rule."""
    rows, heading = [], ""
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
        elif line.startswith("|") and not re.fullmatch(r"\|[\s|:-]+\|", line):
            rows.append((heading, [c.strip() for c in line.strip().strip("|").split("|")]))
    return [(h, cells) for h, cells in rows if cells[0] not in ("module", "modules", "layer")]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented_modules(text: str) -> dict[str, str]:
    """``{module: the package heading it is listed under}`` of the page's layout tables."""
    out = {}
    for heading, cells in _rows(_section(text, "Package layout")):
        (module,) = _names(cells[0])
        assert module not in out, f"{module} has two rows"
        out[module] = (_names(heading) or [""])[0]
    return out


def modules_to_document(sources: Mapping[str, str]) -> set[str]:
    """Every module but a package's ``__init__.py`` that holds only its docstring."""
    return {
        path
        for path, source in sources.items()
        if not path.endswith("__init__.py") or len(ast.parse(source).body) > 1
    }


def layout_mismatches(text: str, sources: Mapping[str, str]) -> list[str]:
    documented = documented_modules(text)
    wanted = modules_to_document(sources)
    problems = [f"{m}: not in the page" for m in sorted(wanted - set(documented))]
    problems += [f"{m}: no such module" for m in sorted(set(documented) - wanted)]
    for module, package in documented.items():
        folder = module.rpartition("/")[0]
        if package != (f"{folder}/" if folder else "pytest_rollout_golden/"):
            problems.append(f"{module}: listed under {package or 'no package heading'}")
    return problems


def stated_rules(text: str) -> set[tuple[str, str, tuple[str, ...]]]:
    """The rows of the page's "Import rules" table, as ``RULES`` writes them."""
    out = set()
    for _, cells in _rows(_section(text, "Import rules")):
        (subject,) = _names(cells[0])
        out.add((subject, cells[1], tuple(_names(cells[2]))))
    return out


def test_the_page_lists_every_module_once_under_its_package():
    assert layout_mismatches(PAGE.read_text(), read_sources()) == []


def stated_layers(text: str) -> list[tuple[str, ...]]:
    """The rows of the page's "Layers" table, bottom first, as ``LAYERS`` writes them."""
    rows = _rows(_section(text, "Layers"))
    return [tuple(_names(cells[1])) for _, cells in sorted(rows, key=lambda r: int(r[1][0]))]


def test_the_page_states_the_layers_this_test_enforces():
    assert stated_layers(PAGE.read_text()) == LAYERS


def test_the_page_states_the_rules_this_test_enforces():
    text = PAGE.read_text()
    assert stated_rules(text) == set(RULES)
    assert "no import cycle" in " ".join(_section(text, "Import rules").split())


def test_a_missing_or_stale_row_is_found():
    text, sources = PAGE.read_text(), read_sources()
    assert layout_mismatches(text, {**sources, "store/extra.py": ""}) == [
        "store/extra.py: not in the page"
    ]
    fewer = {k: v for k, v in sources.items() if k != "store/lock.py"}
    assert layout_mismatches(text, fewer) == ["store/lock.py: no such module"]
