"""Deterministic settings: the ``deterministic`` fixture and context manager, and their default."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from pytest_rollout_golden import deterministic
from pytest_rollout_golden._internal.golden.determinism import DETERMINISTIC_ENV

FIXTURE = """
import json
import os
import pathlib
import random

import numpy as np
import torch

HERE = pathlib.Path(__file__).parent


def test_seeded(deterministic):
    assert deterministic == 0
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    env = {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO",
                                          "NVTE_ALLOW_NONDETERMINISTIC_ALGO")}
    assert env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring",
                   "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    draws = [torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random()]
    with open(HERE / "draws.jsonl", "a") as f:
        f.write(json.dumps(draws) + "\\n")


def test_restored_afterwards():
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == "user-value"
    assert "NCCL_ALGO" not in os.environ
    assert "NVTE_ALLOW_NONDETERMINISTIC_ALGO" not in os.environ
"""


def seeded_draws(seed: int) -> list:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return [torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random()]


def test_fixture_makes_rng_reproducible_and_restores_everything(project, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "user-value")
    for name in ("NCCL_ALGO", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        monkeypatch.delenv(name, raising=False)
    project.write(FIXTURE)
    torch.rand(7)  # move this process's generators away from any seeded state
    rng_before = torch.random.get_rng_state()
    np_before = np.random.get_state()[1].copy()

    for _ in range(2):
        project.run().assert_outcomes(passed=2)
    lines = (project.path / "draws.jsonl").read_text().splitlines()
    first, second = (json.loads(x) for x in lines)
    assert first == second
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert (np.random.get_state()[1] == np_before).all()
    assert first == seeded_draws(0), "the draws come from seeding, not from chance"
    assert not torch.are_deterministic_algorithms_enabled()


GOLDEN = """
import pytest
import torch


def check(golden, values):
    assert torch.are_deterministic_algorithms_enabled() is values["on"]
    golden.check({"draw": torch.rand(1).item()})


def test_default(golden, values):
    check(golden, values)


@pytest.mark.golden(seed=1)
def test_seed_one(golden, values):
    check(golden, values)


@pytest.mark.golden(seed=2)
def test_fixture_requested(golden, deterministic):
    assert deterministic == 2  # the marker's seed; the fixture applies even when opted out
    assert torch.are_deterministic_algorithms_enabled()


@pytest.mark.golden(deterministic=False)
def test_opted_out(golden):
    assert not torch.are_deterministic_algorithms_enabled()
"""


@pytest.mark.parametrize("how", ["default", "--no-golden-deterministic", "ini"])
def test_golden_tests_run_under_deterministic_settings_unless_opted_out(project, how):
    project.write(GOLDEN)
    args = ("--no-golden-deterministic",) if how.startswith("--") else ()
    if how == "ini":
        project.pytester.makeini("[pytest]\ngolden_deterministic = false\n")
    on = how == "default"
    project.set_values(on=on)
    project.run(*args).assert_outcomes(passed=4)
    draws = {t: project.metrics(t)["0"]["draw"] for t in ("test_default", "test_seed_one")}
    if on:
        assert draws["test_default"] == seeded_draws(0)[0][0]
        assert draws["test_seed_one"] == seeded_draws(1)[0][0]
        project.run(*args).assert_outcomes(passed=4)  # and replay reproduces them
    else:
        assert draws["test_default"] != seeded_draws(0)[0][0]


def test_environment_fingerprint_change_is_reported(project):
    project.write(GOLDEN)
    project.set_values(on=False)
    project.run("--no-golden-deterministic", "-k", "test_default").assert_outcomes(passed=1)
    manifest = json.loads((project.golden_dir("test_default") / "manifest.json").read_text())
    assert manifest["fingerprint"]["torch"] == torch.__version__
    assert manifest["fingerprint"]["deterministic_algorithms"] is False

    # Replayed under deterministic settings, where the (unseeded) draw differs: tolerate it.
    project.set_values(on=True)
    result = project.run("-k", "test_default", "--golden-tolerance", "draw:rtol=1,atol=1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "replayed under another environment than recorded (exact lane not applied):",
            "    test_it.py::test_default: deterministic_algorithms: False -> True*",
        ]
    )


# ----------------------------------------------------------------- the context manager


def test_context_manager_restores_rng_flags_and_environment(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True
    try:
        state = torch.random.get_rng_state()
        expected_next = torch.rand(4)
        torch.random.set_rng_state(state)

        with pytest.raises(RuntimeError), deterministic(seed=5) as seed:
            assert seed == 5
            assert torch.are_deterministic_algorithms_enabled()
            assert {k: os.environ[k] for k in DETERMINISTIC_ENV} == DETERMINISTIC_ENV
            assert not torch.backends.cudnn.benchmark
            inside = torch.rand(4)
            raise RuntimeError("restores on errors too")

        torch.manual_seed(5)
        assert torch.equal(inside, torch.rand(4))
        torch.random.set_rng_state(state)
        assert torch.equal(torch.rand(4), expected_next)
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark
        assert os.environ["NCCL_ALGO"] == "Tree"
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    finally:
        torch.backends.cudnn.benchmark = False
