"""Shared helper of the plugin tests: a throw-away pytest project that uses ``golden``.

``project.write(source)`` writes a test file into a pytester directory whose
``conftest.py`` gives the inner tests two helpers: ``values()`` reads
``values.json`` (so a test can change what the inner test computes without
rewriting its source, which could leave a stale ``.pyc`` behind), and
``generated(tag, batch)`` appends ``tag`` to ``calls.log`` and returns
``batch``, so the outer test can prove whether a generator ran.
"""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import types
from collections.abc import Callable
from pathlib import Path

import pytest

INNER_CONFTEST = """
import json
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.fixture
def values():
    path = HERE / "values.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture
def generated():
    def log_and_return(tag, batch):
        with open(HERE / "calls.log", "a") as log:
            log.write(tag + "\\n")
        return batch

    return log_and_return
"""


class Project:
    """A pytester directory with helpers to write tests, run pytest and inspect golden/."""

    def __init__(self, pytester: pytest.Pytester):
        self.pytester = pytester
        self.path = pytester.path
        self.golden = self.path / "golden"
        pytester.makeconftest(INNER_CONFTEST)

    def write(self, source: str, name: str = "test_it") -> Path:
        """Write ``<name>.py``; returns its path."""
        return self.pytester.makepyfile(**{name: source})

    def set_values(self, **values: object) -> None:
        (self.path / "values.json").write_text(json.dumps(values))

    def run(self, *args: str) -> pytest.RunResult:
        """Run pytest in-process (fast; torch is already imported).

        The plugin is already imported by the outer session, so the inner one may
        warn that it cannot rewrite its asserts; that warning is about the harness.
        """
        return self.pytester.runpytest(
            "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
        )

    def run_subprocess(self, *args: str) -> pytest.RunResult:
        """Run pytest in a fresh interpreter (environment variables, xdist)."""
        return self.pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)

    def calls(self) -> list[str]:
        """Tags logged by ``generated()`` since the last call, then forget them."""
        log = self.path / "calls.log"
        if not log.exists():
            return []
        tags = log.read_text().split()
        log.unlink()
        return tags

    def golden_files(self) -> dict[str, bytes]:
        """Every file under golden/ (hidden staging included) by relative path."""
        if not self.golden.exists():
            return {}
        return {
            str(p.relative_to(self.golden)): p.read_bytes()
            for p in sorted(self.golden.rglob("*"))
            if p.is_file()
        }

    def copy_example(self) -> str:
        """examples/ under new module names; returns the test module's name.

        The outer session may have imported the originals, and an in-process run
        would reuse them instead of the copies.
        """
        examples = Path(__file__).parent.parent / "examples"
        source = (examples / "test_tiny_rl_golden.py").read_text()
        assert "from tiny_rl import" in source
        (self.path / "test_example.py").write_text(
            source.replace("from tiny_rl import", "from example_rl import")
        )
        (self.path / "example_rl.py").write_text((examples / "tiny_rl.py").read_text())
        return "test_example"

    def commit(self) -> str:
        """Make the project a git checkout with one empty commit; returns its sha (HEAD)."""
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], cwd=self.path, check=True)
        subprocess.run(
            [*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=self.path, check=True
        )
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=self.path, capture_output=True, text=True, check=True
        ).stdout.strip()

    def golden_dir(self, test: str, module: str = "test_it") -> Path:
        return self.golden / module / test

    def metrics(self, test: str, module: str = "test_it") -> dict:
        return json.loads((self.golden_dir(test, module) / "metrics.json").read_text())["steps"]

    @staticmethod
    def counts(result: pytest.RunResult) -> dict[str, int]:
        """Counts of the summary line ``golden: N replayed, N recorded, N updated, N failed``."""
        line = next(x for x in result.outlines if x.startswith("golden: "))
        return {status: int(n) for n, status in re.findall(r"(\d+) (\w+)", line)}

    @staticmethod
    def mismatch_row(result: pytest.RunResult, metric: str) -> dict[str, str]:
        """The row of ``metric`` in the mismatch table, by column name."""
        lines = result.outlines
        header = next(i for i, x in enumerate(lines) if x.split()[:2] == ["metric", "step"])
        columns = re.split(r"\s{2,}", lines[header].strip())
        for line in lines[header + 1 :]:
            cells = re.split(r"\s{2,}", line.strip())
            if cells[0] == metric:
                return dict(zip(columns, cells, strict=True))
        raise AssertionError(f"no row for {metric!r} in:\n" + "\n".join(lines))


@pytest.fixture(scope="session")
def _preloaded() -> None:
    """Import what inner runs need before pytester snapshots sys.modules.

    An in-process run drops every module it imported. numpy and torch (including
    ``torch._dynamo`` and ``torch._inductor``, which torch's optimizers load lazily on
    their first step) cannot be imported twice in one process, and hypothesis, which
    pytest's hypothesis plugin imports, would be re-imported (and assertion-rewritten,
    ~1.5 s) by every inner run. matplotlib, imported afresh by an inner ``--golden-plot``
    run, would leave classes that later plots of this process no longer recognise.
    """
    import importlib.util

    import hypothesis  # noqa: F401
    import torch
    import torch._inductor.config

    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.backends.backend_agg
        import matplotlib.figure
        import matplotlib.gridspec
        import matplotlib.patches
        import matplotlib.ticker  # noqa: F401

    from pytest_rollout_golden import deterministic

    with deterministic(0):
        weight = torch.nn.Parameter(torch.zeros(1))
        weight.grad = torch.zeros(1)
        torch.optim.Adam([weight]).step()


@pytest.fixture
def project(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, _preloaded: None
) -> Project:
    """A fresh project in default (recording) mode, whatever the CI variable of this run says."""
    monkeypatch.delenv("CI", raising=False)
    return Project(pytester)


@pytest.fixture
def hide_matplotlib(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to make every later ``import matplotlib...`` fail, as without the package."""
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    return lambda: monkeypatch.setattr(builtins, "__import__", no_matplotlib)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: full parallel variant matrix, torchrun runs, framework KL conformance at 300 "
        "examples; `pytest -m slow`",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``slow`` tests unless a ``-m`` expression names them."""
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(
        reason="slow (variant matrix, torchrun, conformance): run with `pytest -m slow`"
    )
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def placeholder_module(name: str) -> types.ModuleType:
    """An empty package whose every attribute is a class of that name: stands in for a heavy
    import (ray, transformers) that real framework code imports but a test never calls."""
    module = types.ModuleType(name)
    module.__path__ = []

    def __getattr__(attribute: str) -> type:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return type(attribute, (), {"__module__": name})

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


@pytest.fixture(scope="session")
def placeholder() -> Callable[[str], types.ModuleType]:
    """:func:`placeholder_module`, for fixtures that import real verl code."""
    return placeholder_module
