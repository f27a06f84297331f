"""The gate tests under a real ``torchrun --nproc-per-node 2`` job, and the NCCL path.

Under torchrun, ``launch`` joins the job's process group instead of spawning workers; every
rank runs the same pytest session and world-size-2 variants run across the two ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from pytest_rollout_golden.parallel import Layout
from pytest_rollout_golden.parallel.policy import PolicyConfig, make_rollout, run
from pytest_rollout_golden.store import location

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_gate_runs_under_torchrun_with_two_ranks():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    env["CI"] = "1"  # replay only
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    gate = "tests/parallel/test_parallel_gate.py"
    command += ["-m", "pytest", gate, "-q", "-p", "no:cacheprovider"]
    command += ["-p", "no:xdist", "-k", "mb1 or dp2 or tp2-pp1"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # each rank prints its own session: the world-size-2 variants ran on both, none failed
    summaries = [line for line in done.stdout.splitlines() if " passed" in line]
    assert len(summaries) == 2 and all("failed" not in s for s in summaries), done.stdout


OUT_OF_STEP_RANKS = """
import pytest


def tagged(rank, tag):
    return f"{tag}-rank{rank}"


def fails_on_rank_1(rank):
    if rank == 1:
        pytest.fail("deliberate pytest.fail on rank 1")  # a BaseException
    return rank
"""

OUT_OF_STEP_CONFTEST = """
import json
import os


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        text = str(report.longrepr) if report.failed else ""
        with open(f"outcomes.{os.environ['RANK']}", "a") as log:
            log.write(json.dumps([report.nodeid.split("::")[-1], report.outcome, text]) + "\\n")


def pytest_sessionfinish(session):
    session.exitstatus = 0  # else torchrun stops the other rank mid-test
"""

OUT_OF_STEP_TESTS = """
import os

import pytest
from ranks import fails_on_rank_1, tagged

from pytest_rollout_golden.parallel import launch


def test_1():
    assert launch(tagged, 2, "test_1", timeout=30) == ["test_1-rank0", "test_1-rank1"]


def test_2():
    launch(fails_on_rank_1, 2)


def test_3():
    if os.environ["RANK"] == "1":
        pytest.fail("rank 1 fails before its launch")
    assert len(launch(tagged, 2, "test_3")) == 2


def test_4():
    assert len(launch(tagged, 2, "test_4")) == 2
"""


def test_under_torchrun_a_rank_that_fails_or_falls_out_of_step_never_lets_another_pass(pytester):
    pytester.makepyfile(ranks=OUT_OF_STEP_RANKS, test_steps=OUT_OF_STEP_TESTS)
    pytester.makeconftest(OUT_OF_STEP_CONFTEST)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(pytester.path)])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["-m", "pytest", "test_steps.py", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = subprocess.run(
        command, cwd=pytester.path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {}
    for rank in (0, 1):
        lines = (pytester.path / f"outcomes.{rank}").read_text().splitlines()
        outcomes[rank] = {test: (outcome, text) for test, outcome, text in map(json.loads, lines)}
    assert {rank: outcomes[rank]["test_1"][0] for rank in (0, 1)} == {0: "passed", 1: "passed"}
    for rank in (0, 1):  # rank 1's BaseException reaches rank 0, which fails too
        outcome, text = outcomes[rank]["test_2"]
        assert outcome == "failed" and "deliberate pytest.fail on rank 1" in text, text
    outcome, text = outcomes[0]["test_3"]  # paired with rank 1's launch of test_4
    assert outcome == "failed", "rank 0 passed with another test's results"
    assert "out of step" in text and "test_steps.py::test_4" in text, text
    assert outcomes[0]["test_4"][0] == "failed"


TWO_GOLDENS = """
import json
import os
import tempfile
from pathlib import Path


def test_small(golden):
    golden.check({"loss": 1.0})
    if os.environ.get("RANK"):  # what this rank copied to its temporary folder
        temp = Path(tempfile.gettempdir())
        copied = [str(p.relative_to(temp)) for p in sorted(temp.rglob("*")) if p.is_file()]
        Path(os.environ["SEEN"]).write_text(json.dumps(copied))


def test_big(golden):
    golden.check({"loss": 2.0})
"""


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


MAKES_A_COPY = """
import os
import sys
import tempfile
from pathlib import Path

from pytest_rollout_golden._internal.pytest_plugin.snapshot import RankSnapshot

temp = Path(sys.argv[1])
tempfile.tempdir = str(temp)
snapshot = RankSnapshot(temp, 1)
if sys.argv[2] == "abandon":  # a rank killed before it could remove its copy
    os._exit(0)
snapshot.path = snapshot.path.rename(temp / sys.argv[2])  # a name with a dead process id
print("ready", flush=True)
sys.stdin.read()
snapshot.remove()
"""


def _rank_copy(temp: Path, name: str) -> subprocess.Popen[str]:
    """A process that made a rank copy through the plugin's code: gone at once
    (``name="abandon"``), or holding it, renamed to ``name``, until its stdin closes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", MAKES_A_COPY, str(temp), name],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if name == "abandon":
        assert process.wait(60) == 0
    else:
        assert process.stdout.readline() == "ready\n"
    return process


def test_a_rank_above_0_copies_only_its_selected_goldens_and_cleans_stale_copies(
    project, monkeypatch, tmp_path_factory
):
    project.write(TWO_GOLDENS)
    seen = project.path / "seen.json"
    monkeypatch.setenv("SEEN", str(seen))
    project.run().assert_outcomes(passed=2)  # not under torchrun: records both
    temp = tmp_path_factory.mktemp("temp")
    # A live copy whose name carries a dead (or, in another PID namespace, reused) process id:
    live = temp / (location.rank_snapshot_prefix(1, _dead_pid()) + "running")
    holder = _rank_copy(temp, live.name)
    _rank_copy(temp, "abandon")  # its marker, no lock held: removed
    (abandoned,) = set(temp.iterdir()) - {live}
    # Folders whose names match, but which the plugin never made:
    host = location.rank_snapshot_prefix(0).split("-")[3]
    foreign = temp / f"rollout-golden-rank0-{host}-999999-my_notes"
    mine_by_name = temp / (location.rank_snapshot_prefix(1, os.getpid()) + "running")
    unlike = temp / "rollout-golden-rank1-not-ours"
    for kept in (foreign, mine_by_name, unlike):
        kept.mkdir()
        (kept / "notes.txt").write_text("keep me")
    assert location.is_rank_snapshot_name(foreign.name)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    try:
        project.run("-k", "small").assert_outcomes(passed=1, deselected=1)
        assert live.is_dir(), "a live rank's copy was deleted"
    finally:
        holder.communicate("")
    assert not abandoned.exists()
    others = {live.name, foreign.name, mine_by_name.name, unlike.name}
    copied = [Path(p) for p in json.loads(seen.read_text())]
    copied = [p for p in copied if not p.name.startswith(".") and p.parts[0] not in others]
    assert copied and all(p.parts[1:3] == ("test_it", "test_small") for p in copied), copied
    assert len({p.parts[0] for p in copied}) == 1
    assert copied[0].parts[0].startswith(location.rank_snapshot_prefix(1))
    # its own copy went at the end; the live one went with its process
    assert sorted(temp.iterdir()) == sorted([foreign, mine_by_name, unlike])
    assert all((p / "notes.txt").read_text() == "keep me" for p in temp.iterdir())

    gone = project.golden / "test_gone" / "test_x"  # a golden whose test file was deleted
    shutil.copytree(project.golden_dir("test_big"), gone)
    project.run("--golden-prune").assert_outcomes(passed=2)  # a whole run, but not rank 0
    assert (gone / location.MANIFEST).is_file()


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason=f"NCCL path NOT exercised: needs 2 CUDA devices, this machine has "
    f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}",
)
def test_nccl_layouts_agree_with_single_process():
    cfg = PolicyConfig(dtype="float64")
    batches = [make_rollout(cfg, step) for step in range(2)]
    reference = run(Layout(), cfg, batches)
    for layout in (Layout(tp=2), Layout(dp=2, packing=True, micro_batches=2), Layout(pp=2)):
        for got, want in zip(run(layout, cfg, batches), reference, strict=True):
            for name, value in want.metrics.items():
                assert got.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-14), layout.id
