"""The CI recipe users copy (examples/ci/*.yml) runs: its install steps install the plugin from
where the recipe says (a pinned git URL, a checked-out submodule), and its test steps gate.

The steps run as GitHub would run them (bash, ``CI=true``) in a fresh virtual environment of
a small project, offline: the plugin comes from this repository's committed HEAD, and the
already installed dependencies (torch, the pins the recipe names) are borrowed from this
environment by a ``.pth`` line, as ``.ci/wheel-smoke`` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "ci"
SUBMODULE = "third_party/pytest-rollout-golden"
GRPO = "test_grpo_training_matches_golden"

TEST_GATE = """\
import torch

def test_gate(golden):
    batch = golden.rollout(lambda: {"x": torch.arange(4.0)})
    golden.check({"loss": float(batch["x"].mean())})
"""

PROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "myrl"
version = "0"

[tool.setuptools]
py-modules = []

[tool.pytest.ini_options]
testpaths = ["tests"]
"""


def recipe(name: str) -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with the docs extra")
    return yaml.safe_load((RECIPES / name).read_text())


def run_steps(steps: list[dict], cwd: Path, env: dict[str, str]) -> None:
    """Each step's ``run:`` in bash (``-e``, as GitHub runs it); a failing step fails the test
    with its output."""
    for step in steps:
        if "run" not in step:
            continue  # `uses:` steps: checkout, setup-python, upload
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]], cwd=cwd, env=env, capture_output=True, text=True
        )
        name = step.get("name", step["run"].splitlines()[0])
        assert done.returncode == 0, f"step {name!r} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A project with one recorded golden, and the environment of a fresh virtual
    environment that resolves ``pip``, ``pytest`` and ``rollout-golden`` (offline)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the recipe installs the plugin from git")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [venv / "bin" / "python", "-c", purelib], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "zz-borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for command in ("pip", "pytest"):  # the scripts of borrowed packages
        shim = venv / "bin" / command
        shim.write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m {command} "$@"\n')
        shim.chmod(0o755)

    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(PROJECT)
    (proj / "tests" / "test_gate.py").write_text(TEST_GATE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    env |= {
        "PATH": f"{venv / 'bin'}:{env['PATH']}",
        "PIP_NO_INDEX": "1",  # offline: every requirement is satisfied or local
        "PIP_NO_BUILD_ISOLATION": "0",  # build with the borrowed setuptools
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    return proj, env


def installed_from(env: dict[str, str], cwd: Path) -> str:
    """Where the environment's ``pytest_rollout_golden`` is (an assertion if it has none)."""
    code = "import pytest_rollout_golden as p; print(p.__file__)"
    done = subprocess.run(["python", "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"the recipe's install left no plugin:\n{done.stderr}"
    return done.stdout


def test_the_precision_gate_recipe_installs_from_a_pinned_git_url_and_replays(project):
    proj, env = project
    workflow = recipe("github-actions.yml")
    env["ROLLOUT_GOLDEN"] = head_requirement()  # the recipe's other form, pinned to a commit
    steps = workflow["jobs"]["cpu"]["steps"]
    install = [s for s in steps if s.get("name") == "Install"]
    run_steps(install, proj, env)
    assert str(proj.parent / "venv") in installed_from(env, proj)
    assert "ROLLOUT_GOLDEN" in workflow["env"]

    record = subprocess.run(["pytest", "-q"], cwd=proj, env=env, capture_output=True, text=True)
    assert "1 recorded" in record.stdout, record.stdout
    gate = [s for s in steps if "run" in s and s.get("name") != "Install"]
    run_steps(gate, proj, env | {"CI": "true"})
    log = (proj / "pytest.log").read_text()
    assert "golden: 1 replayed, 0 recorded, 0 updated, 0 failed" in log, log
    assert (proj / "golden-report.json").exists()
    assert "= rollout golden =" in Path(env["GITHUB_STEP_SUMMARY"]).read_text()


TRAINER = """\
def loss(xs):
    return sum(xs) / len(xs)
"""

TEST_TRAINER = """\
import torch

from trainer import loss  # a module at the repository's root, not an installed package


def test_gate(golden):
    batch = golden.rollout(lambda: {"x": torch.arange(4.0)})
    golden.check({"loss": loss(batch["x"].tolist())})
"""


def head_requirement() -> str:
    """The recipe's pinned-requirement form for this repository's HEAD, from a local path as
    the docs give it (``git+file://localhost/...``: pip 23, Python 3.11's, refuses
    ``git+file:///...@sha``)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"pytest-rollout-golden[plot] @ git+file://localhost{ROOT}@{commit}"


def project_install(steps: list[dict]) -> str:
    """The lines of a job's Install step that install the user's project."""
    [script] = [s["run"] for s in steps if s.get("name") == "Install"]
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("if "))
    return "\n".join(lines[start : lines.index("fi", start) + 1])


def test_the_precision_gate_recipe_runs_in_a_repository_without_packaging(project):
    """A trainer repository of scripts and tests: no pyproject.toml, no setup.py, a
    requirements file and a module its tests import from the root."""
    proj, env = project
    (proj / "pyproject.toml").unlink()
    (proj / "requirements.txt").write_text("numpy\n")  # satisfied by the borrowed packages
    (proj / "trainer.py").write_text(TRAINER)
    (proj / "tests" / "test_gate.py").write_text(TEST_TRAINER)
    env["ROLLOUT_GOLDEN"] = head_requirement()
    jobs = recipe("github-actions.yml")["jobs"]
    steps = jobs["cpu"]["steps"]
    run_steps([s for s in steps if s.get("name") == "Install"], proj, env)
    cpu, gpu = (project_install(jobs[job]["steps"]) for job in ("cpu", "gpu"))
    assert cpu == gpu and "pip install -r requirements.txt" in cpu  # the gpu job's, untried
    assert str(proj.parent / "venv") in installed_from(env, proj)

    record = subprocess.run(
        ["python", "-m", "pytest", "-q"], cwd=proj, env=env, capture_output=True, text=True
    )
    assert "1 recorded" in record.stdout, record.stdout
    gate = [s for s in steps if "run" in s and s.get("name") != "Install"]
    run_steps(gate, proj, env | {"CI": "true"})
    log = (proj / "pytest.log").read_text()
    assert "golden: 1 replayed, 0 recorded, 0 updated, 0 failed" in log, log


def test_the_verify_recipe_installs_the_submodule_as_copied_and_verifies(project):
    proj, env = project
    workflow = recipe("golden-verify.yml")
    source = workflow["env"]["ROLLOUT_GOLDEN"]
    assert source.removeprefix("./").startswith(SUBMODULE), source
    subprocess.run(["git", "clone", "-q", str(ROOT), str(proj / SUBMODULE)], check=True)
    golden = proj / "golden" / "test_grpo"
    shutil.copytree(ROOT / "golden" / "examples" / "test_tiny_rl_golden" / GRPO, golden)
    env["ROLLOUT_GOLDEN"] = source
    steps = workflow["jobs"]["verify"]["steps"]
    run_steps(steps[:-1], proj, env)  # the install, as copied
    assert str(proj.parent / "venv") in installed_from(env, proj)

    run_steps(steps[-1:], proj, env | {"CI": "true"})
    metrics = golden / "metrics.json"
    metrics.write_text(metrics.read_text().replace("0", "1", 1))
    with pytest.raises(AssertionError, match=r"FAIL golden/test_grpo: .*metrics\.json"):
        run_steps(steps[-1:], proj, env | {"CI": "true"})
