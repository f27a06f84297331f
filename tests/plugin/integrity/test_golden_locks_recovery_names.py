"""Goldens on disk under concurrency and foreign checkouts: recovery, locks, line endings, case.

Each test reproduces a way a golden was lost or wrongly written (issue 9, items 5-9).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenError
from pytest_rollout_golden.store import location


def _staged(directory: Path, pid: int) -> Path:
    staging = directory.parent / f".{directory.name}.new-{pid}"
    staging.mkdir(parents=True)
    (staging / "batch.safetensors").write_bytes(b"in progress")
    return staging


def test_recovery_of_one_golden_leaves_a_prefixed_goldens_staging_alone(tmp_path):
    """Recovering ``layout`` leaves ``.layout.new-ref.new-7`` (golden ``layout.new-ref``) alone."""
    layout = tmp_path / "test_x" / "layout"
    other = tmp_path / "test_x" / "layout.new-ref"
    in_progress = _staged(other, os.getpid() + 1)
    # a prefix match (``.layout.new-``) would take it for a staging directory of ``layout``
    store.recover(layout)
    assert in_progress.is_dir() and (in_progress / "batch.safetensors").is_file()
    assert not layout.exists()
    layout.mkdir()
    store.recover(layout)
    assert in_progress.is_dir(), "recovery of `layout` deleted the staging of `layout.new-ref`"


def test_recovery_finishes_a_committed_staging_and_drops_an_uncommitted_one(tmp_path):
    layout = tmp_path / "test_x" / "layout"
    committed = layout.parent / f".layout.new-{os.getpid() + 1}"
    committed.mkdir(parents=True)
    (committed / "metrics.json").write_text("{}")
    files = {"metrics.json": {"digest": "d"}}
    manifest = {"format": store.FORMAT, "schema": store.SCHEMA, "files": files}
    (committed / "manifest.json").write_text(json.dumps(manifest))
    uncommitted = _staged(layout, os.getpid() + 2)
    store.recover(layout)
    assert sorted(p.name for p in layout.iterdir()) == ["manifest.json", "metrics.json"]
    assert not committed.exists() and not uncommitted.exists()


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from pytest_rollout_golden import store

    with store.locked(Path(sys.argv[1]), timeout=float(sys.argv[2])):
        print("held", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    """
)


def _locker(directory: Path, tmpdir: Path, timeout: float = 60) -> subprocess.Popen:
    tmpdir.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmpdir), "TEMP": str(tmpdir), "TMP": str(tmpdir)}
    cmd = [sys.executable, "-c", HOLDER, str(directory), str(timeout)]
    return subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_waiting_process_says_who_holds_the_lock_before_it_times_out(tmp_path):
    directory = tmp_path / "golden" / "test_x" / "test_y"
    holder = _locker(directory, tmp_path / "tmp-a")
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    try:
        waiter = _locker(directory, tmp_path / "tmp-b", timeout=3.0)
        _, err = waiter.communicate(timeout=60)
        notice = next(line for line in err.splitlines() if line.startswith("waiting"))
        assert f"held by pid {holder.pid} on " in notice and "gives up after 3 s" in notice
        assert err.index(notice) < err.index("timed out after 3 s")
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.communicate(timeout=60)


@pytest.mark.parametrize("via", ["same path", "symlinked path"])
def test_processes_with_different_tmpdirs_exclude_each_other(tmp_path, via):
    directory = tmp_path / "golden" / "tests" / "test_x" / "test_y"
    holder = _locker(directory, tmp_path / "tmp-a")
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    lock = location.lock_path(directory)
    assert lock.parent == directory.parent and lock.name == ".test_y.lock"
    try:
        other = directory
        if via == "symlinked path":  # e.g. a bind mount: another name for the same folder
            (tmp_path / "link").symlink_to(tmp_path / "golden")
            other = tmp_path / "link" / "tests" / "test_x" / "test_y"
        waiter = _locker(other, tmp_path / "tmp-b", timeout=1.0)
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode != 0, "a second process took a lock another process holds"
        assert "held" not in out
        assert str(lock) in err and "timed out after 1 s" in err, err
        assert f"pid {holder.pid} on " in err, "the message does not name the holding process"
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        holder.communicate(timeout=60)
    waiter = _locker(directory, tmp_path / "tmp-b", timeout=1.0)
    out, _ = waiter.communicate(input="\n", timeout=60)
    assert out.split() == ["held", "released"], "the lock was not released"
    assert not lock.exists(), "the lock file was left behind"
    assert not directory.parent.exists(), "the lock left the empty folders it created"


def test_a_planted_symlink_as_lock_file_is_refused_not_followed(tmp_path):
    directory = tmp_path / "golden" / "test_x" / "test_y"
    directory.mkdir(parents=True)
    victim = tmp_path / "victim"
    location.lock_path(directory).symlink_to(victim)
    with pytest.raises(GoldenError) as exc, store.locked(directory, timeout=1):
        pass
    assert str(location.lock_path(directory)) in str(exc.value)
    assert "symbolic link" in str(exc.value)
    assert not victim.exists(), "the planted symlink was followed"


def test_a_lock_file_is_never_a_golden_nor_part_of_one(tmp_path):
    import numpy as np

    root = tmp_path / "golden"
    directory = root / "test_x" / "test_y"
    with store.locked(directory):
        store.recover(directory)
        tx = store.Transaction(directory)
        tx.write_batch("batch.safetensors", {"v": np.arange(3)})
        tx.commit({})
        # a crashed holder leaves its lock file behind; nothing may take it for golden content
        location.lock_path(directory).with_name(".stale.lock").write_text("pid 1 on host\n")
        assert location.find_goldens(root) == [directory]
        assert sorted(os.listdir(directory)) == ["batch.safetensors", "manifest.json"]
    assert sorted(store.read_manifest(directory)["files"]) == ["batch.safetensors"]
    assert sorted(os.listdir(directory.parent)) == [".stale.lock", "test_y"]


# --------------------------------------------------------------------------- line endings

REPO = Path(__file__).resolve().parents[3]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _crlf_clone(source: Path, target: Path) -> None:
    """Commit ``source`` as it is and clone it as Git for Windows does by default."""
    _git(source, "init", "-q")
    _git(source, "add", "-A")
    _git(source, "commit", "-qm", "goldens")
    _git(source.parent, "clone", "-q", "-c", "core.autocrlf=true", str(source), str(target))


@needs_git
def test_the_projects_own_goldens_verify_after_a_crlf_clone(tmp_path, capsys):
    from pytest_rollout_golden.cli.verify import verify

    shutil.copytree(REPO / "golden", tmp_path / "src" / "golden")
    _crlf_clone(tmp_path / "src", tmp_path / "clone")
    golden = tmp_path / "clone" / "golden"
    converted = [p for p in golden.rglob("*.json") if b"\r\n" in p.read_bytes()]
    assert converted, "git did not convert line endings; this test would prove nothing"
    for batch in golden.rglob("*.safetensors"):  # binary to git: never converted
        original = tmp_path / "src" / batch.relative_to(tmp_path / "clone")
        assert batch.read_bytes() == original.read_bytes()
    status = verify([golden])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "FAIL" not in out and " 0 with problems" in out, out


CRLF_TEST = """
def test_train(golden):
    batch = golden.rollout(lambda: {"tokens": [1, 2, 3]})
    golden.check({"pg_loss": 0.25 * len(batch["tokens"]), "kl": {"a": 1e-3}["a"]})
"""


@needs_git
def test_a_crlf_checkout_replays_and_a_real_edit_is_still_caught(project, tmp_path_factory):
    project.write(CRLF_TEST)
    project.run().assert_outcomes(passed=1)
    clone = tmp_path_factory.mktemp("crlf") / "clone"
    _crlf_clone(project.path, clone)
    metrics = clone / "golden" / "test_it" / "test_train" / "metrics.json"
    assert b"\r\n" in metrics.read_bytes()
    result = project.pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--golden-strict", str(clone / "test_it.py"), f"--rootdir={clone}"
    )
    result.assert_outcomes(passed=1)
    metrics.write_bytes(metrics.read_bytes().replace(b"0.75", b"0.76"))
    result = project.pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--golden-strict", str(clone / "test_it.py"), f"--rootdir={clone}"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*metrics.json*edited by hand*"])


# --------------------------------------------------------------------------- case, long names


def _casefold_distinct(names: list[str]) -> bool:
    return len({n.casefold() for n in names}) == len(names)


def test_names_that_differ_only_in_case_get_distinct_directories_and_files():
    ids = ["test_x[A]", "test_x[a]", "test_x[Ab-c]", "test_x[aB-c]", "test_x[ab-c]"]
    assert _casefold_distinct([location.safe_name(n) for n in ids])
    rollouts = ["Rollout", "rollout", "ROLLOUT", "actor/Logp", "actor/logp"]
    assert _casefold_distinct([location.safe_name(n, strict=True) for n in rollouts])
    # what was case-unambiguous keeps today's name: no committed golden is orphaned
    for kept in ["test_x[a]", "test_x[bf16-2]", "TestPPO", "test_Loss", "rollout", "policy"]:
        assert location.safe_name(kept, strict=kept in ("rollout", "policy")) == kept


def test_thousands_of_long_ids_with_a_common_prefix_get_distinct_64_bit_names():
    prefix = "test_layout[" + "tp2-pp2-dp2-" * 12
    names = [f"{prefix}{i}]" for i in range(20_000)]
    components = [location.safe_name(n) for n in names]
    assert _casefold_distinct(components)
    assert all(len(c.rsplit("~", 1)[1]) >= 16 for c in components), "a 32-bit hash collides"


def test_the_projects_committed_goldens_keep_their_paths():
    """Every committed golden is found where its recording test and names put it today."""
    from pytest_rollout_golden.store.location import rollout_filename, tensors_filename

    goldens = location.find_goldens(REPO / "golden")
    assert len(goldens) >= 3
    for directory in goldens:
        rel = directory.relative_to(REPO / "golden")
        assert all(location.safe_name(part) == part for part in rel.parts[1:]), rel
        for filename, info in store.read_manifest(directory)["files"].items():
            if info.get("kind") == "rollout":
                assert rollout_filename(info["name"], info["step"]) == filename
            elif info.get("kind") == "tensors":
                where = (info["name"], info["step"], info.get("rank"), info.get("micro"))
                assert tensors_filename(*where) == filename


CASE_TEST = """
import pytest


@pytest.mark.parametrize("opt", ["Adam", "adam"])
def test_opt(golden, opt):
    golden.rollout(lambda: {"who": [opt]}, name="Rollout")
    golden.rollout(lambda: {"who": [opt + "!"]}, name="rollout")
    golden.check({"loss": float(len(opt) + (opt == "adam"))})
"""


def test_case_twins_record_and_replay_their_own_goldens(project):
    project.write(CASE_TEST)
    project.run().assert_outcomes(passed=2)
    tests = sorted(p.name for p in (project.golden / "test_it").iterdir())
    assert len(tests) == 2 and _casefold_distinct(tests), tests
    for test in tests:
        files = sorted(p.name for p in (project.golden / "test_it" / test).iterdir())
        assert len(files) == 4 and _casefold_distinct(files), files
    replay = project.run("--golden-strict")
    replay.assert_outcomes(passed=2)
    assert project.counts(replay)["replayed"] == 2


# --------------------------------------------------------------------------- rollout-golden verify


def _golden(directory: Path, value: float = 0.5) -> None:
    import numpy as np

    with store.locked(directory):
        tx = store.Transaction(directory)
        tx.write_batch("rollout.safetensors", {"ids": np.arange(6)})
        tx.write_json("metrics.json", {"steps": {"0": {"pg_loss": value}}})
        tx.commit({"test": f"tests/test_x.py::{directory.name}"})


def _verify(capsys, *paths: Path) -> tuple[int, str, str]:
    from pytest_rollout_golden.cli import main

    status = main(["verify", *map(str, paths)])
    out, err = capsys.readouterr()
    return status, out, err


def test_verify_reports_every_golden_past_bad_ones(tmp_path, capsys):
    root = tmp_path / "golden"
    for name in ("a_no_digest", "b_flipped", "c_fine"):
        _golden(root / "test_x" / name)
    manifest = root / "test_x" / "a_no_digest" / "manifest.json"
    document = json.loads(manifest.read_text())
    del document["files"]["metrics.json"]["digest"]  # a plausible hand edit
    manifest.write_text(json.dumps(document))
    batch = root / "test_x" / "b_flipped" / "rollout.safetensors"
    data = bytearray(batch.read_bytes())
    data[-1] ^= 1
    batch.write_bytes(bytes(data))

    status, out, _ = _verify(capsys, root)
    assert status in (1, 2), out  # 2 while a hand-edited manifest is beyond this version
    lines = out.splitlines()
    status_word, rest = lines[0].split(maxsplit=1)
    assert status_word in ("FAIL", "ERROR") and rest.startswith(
        f"{root / 'test_x' / 'a_no_digest'}: "
    )
    assert lines[1].startswith(f"FAIL {root / 'test_x' / 'b_flipped'}: ") and "checksum" in lines[1]
    assert lines[2] == f"ok   {root / 'test_x' / 'c_fine'} (2 files)"
    assert lines[3].startswith("3 goldens checked, ")


def test_verify_tells_a_problem_from_a_run_that_could_not_check(tmp_path, capsys):
    root = tmp_path / "golden"
    _golden(root / "test_x" / "test_y")
    assert _verify(capsys, root)[0] == 0
    status, _, err = _verify(capsys, tmp_path / "no-such-dir")
    assert status == 2 and f"{tmp_path / 'no-such-dir'}: no such file or directory" in err
    (tmp_path / "empty").mkdir()
    status, _, err = _verify(capsys, tmp_path / "empty")
    assert status == 2 and "no golden" in err and "golden_dir" in err
    metrics = root / "test_x" / "test_y" / "metrics.json"
    metrics.write_text(metrics.read_text().replace("0.5", "0.6"))
    assert _verify(capsys, root)[0] == 1


def test_verify_reports_a_half_committed_golden(tmp_path, capsys):
    root = tmp_path / "golden"
    golden = root / "test_x" / "test_y"
    _golden(golden)
    staged = golden.parent / ".test_y.new-4242"
    shutil.copytree(golden, staged)  # killed after the commit point, before moving files in
    status, out, _ = _verify(capsys, root)
    assert status == 1 and f"FAIL {golden}: half-committed" in out and staged.name in out
    (staged / "manifest.json").unlink()  # killed before the commit point: the golden stands
    assert _verify(capsys, root)[0] == 0


def test_verify_follows_symlinked_goldens_like_replay(tmp_path, capsys):
    root = tmp_path / "golden"
    _golden(tmp_path / "elsewhere" / "test_y")
    (root / "test_x").mkdir(parents=True)
    (root / "test_x" / "test_y").symlink_to(tmp_path / "elsewhere" / "test_y")
    (root / "loop").symlink_to(root)  # a cycle must end
    status, out, _ = _verify(capsys, root)
    assert status == 0, out
    assert f"ok   {root / 'test_x' / 'test_y'} (2 files)" in out
    assert "1 golden checked" in out


# --------------------------------------------------------------------------- exact lane, NaN

NAN_TEST = """
import math

import pytest
import torch


@pytest.mark.golden(exact=True)
def test_nan(golden, values):
    nan = math.copysign(math.nan, values["nan_sign"])
    zero = math.copysign(0.0, values["zero_sign"])
    if values["what"] == "metric":
        golden.check({"m": nan, "z": zero})
    else:
        golden.check_tensors("t", {"x": torch.tensor([nan, zero], dtype=torch.float64)})
"""


@pytest.mark.parametrize("what", ["metric", "tensor"])
@pytest.mark.parametrize(
    ("recorded", "replayed", "passes"),
    [
        ((-1, 1), (1, 1), False),
        ((1, 1), (-1, 1), False),
        ((-1, 1), (-1, 1), True),
        ((1, 1), (1, 1), True),
        ((1, 1), (1, -1), False),
    ],
)
def test_exact_lane_matches_a_nan_only_to_its_own_bits_in_metrics_and_tensors(
    project, what, recorded, replayed, passes
):
    """A NaN matches only a NaN of its sign and payload, in metrics (which keep the bits) as
    in tensors; -0.0 never matches 0.0."""
    import math
    import struct

    assert struct.pack("<d", math.copysign(math.nan, -1)) != struct.pack("<d", math.nan)
    project.write(NAN_TEST)
    project.set_values(what=what, nan_sign=recorded[0], zero_sign=recorded[1])
    project.run().assert_outcomes(passed=1)
    project.set_values(what=what, nan_sign=replayed[0], zero_sign=replayed[1])
    result = project.run()
    result.assert_outcomes(**({"passed": 1} if passes else {"failed": 1}))
    assert project.counts(result)["replayed" if passes else "failed"] == 1


def test_a_read_only_checkout_replays_without_a_lock(tmp_path, monkeypatch):
    """Where no lock file can be created, nothing can be written either: replay reads unlocked."""
    import errno

    import torch

    from pytest_rollout_golden import Golden, Mode
    from pytest_rollout_golden.errors import GoldenMismatch

    directory = tmp_path / "golden" / "test_x" / "test_y"

    def run(pg_loss: float) -> None:
        with Golden(directory, mode=Mode.AUTO) as golden:
            batch = golden.rollout(lambda: {"ids": torch.arange(4)})
            golden.check({"pg_loss": pg_loss * float(batch["ids"].sum())})

    run(0.5)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if str(path).endswith(".lock") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    run(0.5)
    with pytest.raises(GoldenMismatch):
        run(0.6)
    assert not location.lock_path(directory).exists()


def _commit(directory: Path, files: dict[str, int]) -> None:
    txn = store.Transaction(directory)
    for name, value in files.items():
        txn.write_json(name, {"value": value})
    txn.commit({"test": "t"})


@pytest.mark.parametrize("removed_before_the_kill", range(7))
def test_a_kill_while_the_old_version_is_deleted_is_recovered_cleanly(
    tmp_path, monkeypatch, removed_before_the_kill
):
    """SIGKILL after the commit point, part-way through deleting the files the new version
    drops: the next recovery deletes the rest and brings none of them back;
    what the golden does not own (a user's file, a nested golden) is never deleted."""
    golden = tmp_path / "test_x" / "test_a"
    old = {f"old_{i}.json": i for i in range(4)} | {"metrics.json": 0}
    _commit(golden, old)
    (golden / "notes.txt").write_text("mine")
    _commit(golden / "inner", {"metrics.json": 7})
    calls = 0
    real_unlink = os.unlink

    def killed_part_way(*args, **kwargs):
        nonlocal calls
        if calls == removed_before_the_kill:
            raise KeyboardInterrupt("killed")
        calls += 1
        return real_unlink(*args, **kwargs)

    monkeypatch.setattr(os, "unlink", killed_part_way)
    with contextlib.suppress(KeyboardInterrupt):
        _commit(golden, {"metrics.json": 1})
    monkeypatch.setattr(os, "unlink", real_unlink)

    store.recover(golden)
    assert sorted(p.name for p in golden.parent.iterdir()) == ["test_a"]
    owned_and_foreign = ["inner", "manifest.json", "metrics.json", "notes.txt"]
    assert sorted(p.name for p in golden.iterdir()) == owned_and_foreign
    assert store.read_json(golden / "metrics.json") == {"value": 1}
    assert (golden / "notes.txt").read_text() == "mine"
    assert store.read_json(golden / "inner" / "metrics.json") == {"value": 7}
