"""Hardening of the plugin: hostile names, crashes mid-update, concurrent workers, odd metrics.

Uses the ``project`` fixture of ``conftest.py`` (a pytester project in recording mode).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_rollout_golden import store
from pytest_rollout_golden.store.location import find_goldens

NO_HYPOTHESIS = ("-p", "no:hypothesispytest")  # its plugin costs ~0.7 s per fresh process


def assert_every_golden_valid(root: Path) -> list[Path]:
    """Every golden under ``root`` loads, every file matching its manifest's checksum."""
    goldens = find_goldens(root)
    for directory in goldens:
        manifest = store.read_manifest(directory)
        assert manifest is not None and manifest["files"], directory
        for filename, info in manifest["files"].items():
            path = directory / filename
            if filename.endswith(".json"):
                store.read_json(path, expect_digest=info["digest"])
            else:
                store.load_batch(path, expect_digest=info["digest"])
    leftovers = [p for p in root.rglob(".*")]
    assert not leftovers, f"staging or backup directories left behind: {leftovers}"
    return goldens


def files_outside_golden(project) -> set[Path]:
    """Every file around the project (its neighbours included) that is not under golden/."""
    return {
        p
        for p in project.path.parent.rglob("*")
        if not p.is_relative_to(project.golden) and "__pycache__" not in p.parts
    }


# --------------------------------------------------------------------------- names

ODD_IDS = [
    "a/b", "a_b", "a b", "a:b", "a\\b", "../../escape", "/abs/path", "..", ".", ".hidden",
    "C:\\win", "ünï", "tab\t", "x" * 150, "x" * 150 + "y", "a*b?", "<>|&;$`",
]  # fmt: skip

ODD_TEST_IDS = f"""
import pytest
import torch

IDS = {ODD_IDS!r}


@pytest.mark.parametrize("case", range(len(IDS)), ids=IDS)
def test_case(golden, case):
    batch = golden.rollout(lambda: {{"v": torch.full((2,), float(case))}})
    assert batch["v"].tolist() == [float(case)] * 2
    golden.check({{"case": float(case)}})
"""


def test_odd_parametrize_ids_stay_inside_golden_and_never_collide(project):
    project.write(ODD_TEST_IDS)
    outside = files_outside_golden(project)
    project.run().assert_outcomes(passed=len(ODD_IDS))

    goldens = find_goldens(project.golden)
    assert len(goldens) == len(ODD_IDS), sorted(str(g) for g in goldens)
    root = project.golden.resolve()
    for directory in goldens:
        assert directory.resolve().is_relative_to(root / "test_it"), directory
    assert files_outside_golden(project) == outside, "a golden was written outside golden/"
    assert not Path("/abs/path").exists()

    # Each case replays its own golden: a collision would replay another case's value.
    replayed = project.run("--golden-strict")
    replayed.assert_outcomes(passed=len(ODD_IDS))
    assert project.counts(replayed)["replayed"] == len(ODD_IDS)


ODD_NAMES = [
    "a/b", "a_b", "a.b", "a-b", "../../../escape", "/etc/passwd", "..", ".", "",
    "ünï", "x" * 300, "x" * 300 + "y", "rollout", "tensors-forward-step000000", "step000001",
]  # fmt: skip

ODD_ROLLOUT_NAMES = f"""
import torch

NAMES = {ODD_NAMES!r}


def test_names(golden):
    for i, name in enumerate(NAMES):
        for step in range(2):
            batch = golden.rollout(
                lambda i=i, step=step: {{"v": torch.tensor([i + step / 10])}}, step=step, name=name
            )
            assert batch["v"].item() == torch.tensor([i + step / 10]).item(), (name, step)
            golden.check_tensors(name, {{name: batch["v"] * 2}}, step=step)
    golden.check({{name: float(i) for i, name in enumerate(NAMES)}})
"""


def test_odd_rollout_tensor_and_metric_names_never_collide(project):
    project.write(ODD_ROLLOUT_NAMES)
    outside = files_outside_golden(project)
    project.run().assert_outcomes(passed=1)

    directory = project.golden_dir("test_names")
    files = sorted(p.name for p in directory.iterdir())
    assert len(files) == 2 * 2 * len(ODD_NAMES) + 2, files  # rollouts, tensors, manifest, metrics
    assert all(p.parent == directory for p in directory.rglob("*")), "a name created a subfolder"
    assert files_outside_golden(project) == outside, "a golden was written outside golden/"
    assert set(project.metrics("test_names")["0"]) == set(ODD_NAMES)

    replayed = project.run("--golden-strict")
    replayed.assert_outcomes(passed=1)
    assert project.counts(replayed)["replayed"] == 1


# --------------------------------------------------------------------------- crash safety

UPDATED_TRAINING = """
import torch


def train(golden, values, salt):
    for step in range(4):
        g = torch.Generator().manual_seed(values["seed"] * 1000 + salt * 10 + step)

        def generate():
            print("generating", flush=True)
            return {"x": torch.randn(1 << 20, generator=g)}  # 4 MiB per step

        batch = golden.rollout(generate, step=step)
        # Metrics computed from the replayed batch: a golden whose metrics and batch come
        # from two different recordings fails.
        golden.check({"total": float(batch["x"].double().sum())}, step=step)


def test_a(golden, values):
    train(golden, values, 1)


def test_b(golden, values):
    train(golden, values, 2)


def test_c(golden, values):
    train(golden, values, 3)
"""


def _start_update(project) -> subprocess.Popen:
    """``pytest --update-golden`` in a fresh process, returned once it generates a rollout."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NO_HYPOTHESIS, "-s", "-q"]
    proc = subprocess.Popen(
        [*cmd, "--update-golden", "--golden-regenerate"],
        cwd=project.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    while "generating" not in (line := proc.stdout.readline()):
        assert line, "pytest --update-golden ended before generating:\n" + "".join(seen)
        seen.append(line)
    return proc


def _assert_replays_cleanly(project) -> None:
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=3)
    assert project.counts(result) == {"replayed": 3, "recorded": 0, "updated": 0, "failed": 0}
    assert_every_golden_valid(project.golden)


def test_sigkill_during_update_golden_keeps_a_consistent_golden(project):
    project.write(UPDATED_TRAINING)
    project.set_values(seed=1)
    start = time.perf_counter()  # in process: about the time an update spends writing
    project.run().assert_outcomes(passed=3)
    duration = time.perf_counter() - start
    _assert_replays_cleanly(project)

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for attempt in range(2, 6):
        project.set_values(seed=attempt)
        proc = _start_update(project)
        delay = rng.uniform(0, duration)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
        # Whatever survived, each golden is one whole recording and replays without recording.
        try:
            _assert_replays_cleanly(project)
        except BaseException as exc:
            raise AssertionError(f"seed {seed}: killed {delay:.3f} s after generating") from exc


# --------------------------------------------------------------------------- xdist

MANY_WORKERS = """
import pytest
import torch


@pytest.mark.parametrize("i", range(32))
def test_case(golden, i):
    g = torch.Generator().manual_seed(i)
    batch = golden.rollout(lambda: {"x": torch.randn(64, 64, generator=g), "uid": [f"u{i}"]})
    assert batch["uid"] == [f"u{i}"]
    golden.check({"loss": float(batch["x"].double().sum()), "i": i})
    golden.check_tensors("forward", {"log_probs": batch["x"] * 2}, rank=i % 2)


@pytest.mark.golden(key="shared")
@pytest.mark.parametrize("j", range(8))
def test_shared(golden, j):
    batch = golden.rollout(lambda: {"x": torch.arange(1000.0)})
    golden.check({"sum": float(batch["x"].sum())})
"""


def test_two_workers_recording_forty_tests_at_once(project):
    pytest.importorskip("xdist")
    project.write(MANY_WORKERS)
    recorded = project.run_subprocess("-n", "2", *NO_HYPOTHESIS)
    recorded.assert_outcomes(passed=40)
    # The shared golden is recorded by whichever case runs first, the others replay it.
    assert project.counts(recorded) == {"replayed": 7, "recorded": 33, "updated": 0, "failed": 0}
    assert len(assert_every_golden_valid(project.golden)) == 33

    replayed = project.run_subprocess("-n", "2", "--golden-strict", *NO_HYPOTHESIS)
    replayed.assert_outcomes(passed=40)
    assert project.counts(replayed) == {"replayed": 40, "recorded": 0, "updated": 0, "failed": 0}


# --------------------------------------------------------------------------- metric values

METRIC_TYPES = """
import numpy as np
import torch


def test_types(golden, values):
    metrics = {
        "np_f32": np.float32(0.25),
        "np_f64": np.float64(1 / 3),
        "np_i64": np.int64(-7),
        "np_bool": np.bool_(True),
        "np_vec": np.array([0.5, -0.0, np.inf], dtype=np.float16),
        "py_int": 12345678901,
        "py_bool": False,
        "py_float": 0.1,
        "t0_f32": torch.tensor(0.5),
        "t0_bf16": torch.tensor(0.1, dtype=torch.bfloat16),
        "t0_i32": torch.tensor(3, dtype=torch.int32),
        "t_grad": (torch.ones(3, requires_grad=True) * 2).sum(),
        "t_vec": torch.tensor([1.0, -float("inf"), float("inf")]),
    }
    if values.get("other_dtypes"):  # the same values, handed over as other types
        metrics.update(
            np_f32=torch.tensor(0.25, dtype=torch.float64),
            np_i64=torch.tensor(-7),
            py_int=np.int64(12345678901),
            t0_f32=np.float16(0.5),
            t0_i32=3,
            t_vec=np.array([1.0, -np.inf, np.inf]),
        )
    golden.check(metrics)
"""


def test_metrics_of_every_type_record_and_replay(project):
    project.write(METRIC_TYPES)
    project.set_values()
    project.run().assert_outcomes(passed=1)
    recorded = project.metrics("test_types")["0"]
    assert recorded["py_float"] == 0.1 and recorded["py_int"] == 12345678901
    assert recorded["t0_bf16"] == {"dtype": "bfloat16", "value": 0.10009765625}
    assert recorded["t_vec"]["values"] == [1.0, "-inf", "inf"]

    same = project.run("--golden-strict")
    same.assert_outcomes(passed=1)
    assert project.counts(same)["replayed"] == 1

    project.set_values(other_dtypes=True)
    project.run("--golden-strict").assert_outcomes(passed=1)


NAN_TENSORS = """
import torch


def test_nan(golden):
    lp = torch.tensor([[-0.5, float("nan")], [float("-inf"), -1.0]])
    golden.check({"lp_mean": lp})
    golden.check_tensors("forward", {"log_probs": lp})
"""


@pytest.mark.parametrize("equal_nan", [False, True])
def test_nan_inside_tensors_follows_equal_nan(project, equal_nan):
    project.write(NAN_TENSORS)
    project.run().assert_outcomes(passed=1)
    flags = []
    if equal_nan:
        for name in ("lp_mean", "forward/log_probs"):
            flags += ["--golden-tolerance", f"{name}:rtol=1e-5,atol=1e-6,equal_nan=true"]
    result = project.run(*flags)
    if equal_nan:
        result.assert_outcomes(passed=1)
        return
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert out.count("NaN against NaN at 1 element(s) (equal_nan is off)") == 2, out


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ('torch.empty(2, device="meta")', "tensor on meta is not a metric"),
        ("torch.zeros(2, dtype=torch.complex64)", "is not a metric"),
        ("'0.5'", "got str"),
        ("None", "got NoneType"),
        ("2**70", "metric 'm' at step 0"),
    ],
)
def test_values_that_are_not_metrics_fail_with_the_metric_name(project, value, phrase):
    project.write(
        f"""
        import torch


        def test_bad(golden):
            golden.check({{"ok": 1.0}})
            golden.check({{"m": {value}}})
        """
    )
    result = project.run()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "metric 'm' at step 0" in out and phrase in out, out
    assert not project.golden.exists(), "a failed test recorded a golden"
