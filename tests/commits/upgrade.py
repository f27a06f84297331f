"""A tiny project whose loss goes through a library, ``tinylib``, and stand-ins for virtual
environments that differ in its version (``compare --python-a/--python-b``'s tests and docs).

An environment is a script acting as ``python``: this interpreter with one more import
folder, holding ``tinylib`` and its ``.dist-info`` (so that ``importlib.metadata`` names its
version). ``tinylib`` 1.1 scales the loss by 1 + 1e-3, ten times the default relative
tolerance of a loss (1e-4): the gate fails on it at every step. ``tinylib`` 2.0 drops the
function the code calls.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from history import git, run_pytest
from tinyrepo import TinyRepo

LIB = {
    "1.0": "def scale(x):\n    return x\n",
    "1.1": "def scale(x):\n    return x * 1.001\n\n\ndef new_api():\n    return True\n",
    "2.0": "def new_api():\n    return True\n",  # scale() is gone
}
CALC = """
import tinylib


def loss(step):
    return tinylib.scale(0.5 + 0.125 * step)


def grad_norm(step):
    return 1.0 + 0.25 * step
"""
TESTS = """
import calc
import tinylib


def test_loss(golden):
    for step in range(3):
        golden.check({"pg_loss": calc.loss(step)}, step=step)


def test_grad_norm(golden):
    for step in range(3):
        golden.check({"grad_norm": calc.grad_norm(step)}, step=step)
"""
LATER_TESTS = """

def test_new_api():
    assert hasattr(tinylib, "new_api"), "tinylib has no new_api"


def test_always_broken():
    assert 1 == 2, "broken whatever the environment"
"""


def environment(folder: Path, version: str) -> str:
    """A ``python`` whose import path holds ``tinylib`` ``version``; returns its path."""
    site = folder / "site"
    (site / "tinylib").mkdir(parents=True)
    (site / "tinylib" / "__init__.py").write_text(LIB[version])
    info = site / f"tinylib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tinylib\nVersion: {version}\n")
    python = folder / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)


def build(base: Path) -> tuple[TinyRepo, dict[str, str]]:
    """The project under ``base/project``, its goldens recorded in the old environment and
    committed, then two more tests (one needs tinylib 1.1, one always fails); and the
    environments' pythons: ``old``, ``same`` (another copy of the old one), ``new`` (1.1)
    and ``broken`` (2.0), under ``base/envs``."""
    envs = {
        name: environment(base / "envs" / name, version)
        for name, version in (("old", "1.0"), ("same", "1.0"), ("new", "1.1"), ("broken", "2.0"))
    }
    repo = TinyRepo(base / "project")
    repo.commit("calc on tinylib", {"calc.py": CALC, "test_calc.py": TESTS})
    site = str(base / "envs" / "old" / "site")
    recorded = run_pytest(repo.path, PYTHONPATH=os.pathsep.join([*sys.path[1:], site]))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    git(repo.path, "add", "golden")
    git(repo.path, "commit", "-q", "-m", "record goldens")
    repo.commit("two more tests", {"test_calc.py": TESTS + LATER_TESTS})
    return repo, envs
