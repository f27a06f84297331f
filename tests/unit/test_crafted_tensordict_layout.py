"""A re-signed golden whose layout gives a TensorDict a wrong batch_size or device.

Replay refuses it with a GoldenFormatError naming the file, the key and the remedy, never
tensordict's own RuntimeError or meta tensors; ``rollout-golden verify`` (which never
imports tensordict) runs the same decoder, so it reports the file damaged too. A device
this machine lacks maps to the closest one it has, as for a plain tensor.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_crafted_files import _read_header, write_safetensors

from pytest_rollout_golden import store
from pytest_rollout_golden._internal.golden.golden import Golden
from pytest_rollout_golden._internal.results import Mode
from pytest_rollout_golden.cli import main
from pytest_rollout_golden.errors import GoldenFormatError
from pytest_rollout_golden.store import location

ROLLOUT = location.rollout_filename("rollout", 0)
REMEDY = "--update-golden"


@pytest.fixture
def td():
    try:
        return importlib.import_module("tensordict")
    except ImportError:
        pytest.skip("tensordict is not installed; pip install --no-deps tensordict==0.10.0")


def make_batch(td: Any) -> Any:
    inner = td.TensorDict({"values": torch.randn(3, 2)}, batch_size=[3], device="cpu")
    return td.TensorDict(
        {"input_ids": torch.arange(12).view(3, 4), "critic": inner}, batch_size=[3], device="cpu"
    )


def record(directory: Path, td: Any) -> None:
    with Golden(directory, mode=Mode.AUTO) as golden:
        golden.rollout(lambda: make_batch(td))
        golden.check({"pg_loss": 0.5})


def resign(directory: Path, edit: Any) -> Path:
    """Edit the rollout's layout with ``edit(layout)``, re-sign the file and its manifest entry."""
    path = directory / ROLLOUT
    header, payload = _read_header(path)
    layout = json.loads(header["__metadata__"]["prg.layout"])
    edit(layout)
    header["__metadata__"]["prg.layout"] = json.dumps(layout)
    write_safetensors(path, header, payload)
    manifest_path = directory / location.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][ROLLOUT]["digest"] = _read_header(path)[0]["__metadata__"]["prg.digest"]
    manifest_path.write_text(json.dumps(manifest))
    return path


def critic(layout: dict) -> dict:
    return dict(layout["items"])["critic"]


def setter(field: str, value: Any, *, inner: bool = False) -> Any:
    def edit(layout: dict) -> None:
        (critic(layout) if inner else layout)[field] = value

    return edit


# name -> (edit, what the message says besides the file and the remedy)
DAMAGE: dict[str, tuple[Any, list[str]]] = {
    "batch_size longer than the tensors": (setter("batch_size", [4]), ["[4]", "'input_ids'"]),
    "batch_size with an extra dim": (setter("batch_size", [3, 5]), ["[3, 5]"]),
    "negative batch_size": (setter("batch_size", [-1]), ["[-1]"]),
    "batch_size is a string": (setter("batch_size", "3"), ["batch_size"]),
    "batch_size of a bool": (setter("batch_size", [True]), ["batch_size"]),
    "inner batch_size": (setter("batch_size", [2], inner=True), ["'critic'", "'values'"]),
    "inner batch_size shorter than the outer one": (
        setter("batch_size", [], inner=True),
        ["'critic'"],
    ),
    "device meta": (setter("device", "meta"), ["'meta'"]),
    "inner device meta": (setter("device", "meta", inner=True), ["'meta'", "'critic'"]),
    "unknown device type": (setter("device", "foo"), ["'foo'"]),
    "device is a number": (setter("device", 0), ["device"]),
    "device cuda:-1": (setter("device", "cuda:-1"), ["'cuda:-1'"]),
}


def assert_clear(message: str, path: Path, words: list[str]) -> None:
    assert str(path) in message, message
    assert REMEDY in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("case", DAMAGE)
def test_replay_refuses_a_crafted_tensordict_naming_file_key_and_remedy(tmp_path, td, case):
    directory = tmp_path / "golden" / "t"
    record(directory, td)
    edit, words = DAMAGE[case]
    path = resign(directory, edit)
    with pytest.raises(GoldenFormatError) as exc:
        record(directory, td)  # replays: the golden exists
    assert_clear(str(exc.value), path, words)


@pytest.mark.parametrize("case", DAMAGE)
def test_verify_reports_a_crafted_tensordict_as_damaged(tmp_path, td, case, capsys, monkeypatch):
    directory = tmp_path / "golden" / "t"
    record(directory, td)
    edit, words = DAMAGE[case]
    path = resign(directory, edit)
    monkeypatch.delitem(sys.modules, "tensordict")  # `rollout-golden verify` never imports it
    assert main(["verify", str(tmp_path / "golden")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL "), out
    assert_clear(out, path, words)


@pytest.mark.parametrize("device", ["cuda:0", "cuda", "xpu:1", "npu:0", "mps"])
def test_a_tensordict_device_this_machine_lacks_loads_on_the_closest_one(tmp_path, td, device):
    available = {
        "cuda": torch.cuda.is_available(),
        "xpu": torch.xpu.is_available(),
        "mps": torch.backends.mps.is_available(),
        "npu": False,
    }
    if available[device.partition(":")[0]]:
        pytest.skip(f"this machine has {device}")
    directory = tmp_path / "golden" / "t"
    record(directory, td)
    resign(directory, setter("device", device))
    assert main(["verify", str(directory)]) == 0
    with Golden(directory, mode=Mode.STRICT) as golden:
        batch = golden.rollout(lambda: pytest.fail("replay must not regenerate"))
        golden.check({"pg_loss": 0.5})
    assert type(batch) is td.TensorDict and batch.device == torch.device("cpu")
    assert batch.batch_size == torch.Size([3]) and batch["input_ids"].shape == (3, 4)


def test_the_recorded_tensordict_verifies_and_replays(tmp_path, td):
    """Control: the crafting helper changes nothing by itself."""
    directory = tmp_path / "golden" / "t"
    record(directory, td)
    resign(directory, lambda layout: None)
    assert main(["verify", str(directory)]) == 0
    record(directory, td)


def test_crafted_batch_size_in_a_plain_file_names_the_key(tmp_path, td):
    path = tmp_path / "b.safetensors"
    store.save_batch(path, {"batch": make_batch(td), "meta": 1})
    header, payload = _read_header(path)
    layout = json.loads(header["__metadata__"]["prg.layout"])
    dict(layout["items"])["batch"]["batch_size"] = [7]
    header["__metadata__"]["prg.layout"] = json.dumps(layout)
    write_safetensors(path, header, payload)
    with pytest.raises(GoldenFormatError) as exc:
        store.load_batch(path)
    assert_clear(str(exc.value), path, ["['batch']", "[7]", "'input_ids'", "(3, 4)"])
