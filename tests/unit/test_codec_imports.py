"""Loading a golden imports nothing (issue 16, item 13).

A batch file's layout names the class of a DataProto-like batch as
``module:qualname``. The class is used only if the process already imported
it; the name is resolved through ``sys.modules`` and the modules' and classes'
own namespaces, never through a lazy module's ``__getattr__`` (torch's imports
``torch._inductor``, ``torch._dynamo`` and hundreds of modules behind them).
An unknown class falls back to :class:`~pytest_rollout_golden.store.codec.RolloutBatch`.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_rollout_golden import load_batch, save_batch, store
from pytest_rollout_golden.store import codec


@dataclasses.dataclass
class DataProtoLike:
    batch: Any
    non_tensor_batch: dict[str, Any]
    meta_info: dict[str, Any]


class Outer:
    @dataclasses.dataclass
    class Inner:
        batch: Any
        non_tensor_batch: dict[str, Any]
        meta_info: dict[str, Any]


def batch_of(cls: type) -> Any:
    return cls(batch={"ids": torch.arange(3)}, non_tensor_batch={}, meta_info={"step": 1})


def with_class_name(path: Path, spec: str) -> Path:
    """Rewrite the class name in the layout of the batch file at ``path``; re-sign the file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    metadata = header["__metadata__"]
    layout = json.loads(metadata["prg.layout"])
    layout["cls"] = spec
    metadata["prg.layout"] = json.dumps(layout)
    del metadata["prg.digest"]
    metadata["prg.digest"] = store.checksum([store.canonical_header(header), data])
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    return path


def crafted(tmp_path: Path, spec: str, name: str = "crafted") -> Path:
    path = tmp_path / f"{name}.safetensors"
    save_batch(path, batch_of(DataProtoLike))
    return with_class_name(path, spec)


LOAD_AND_COUNT = textwrap.dedent(
    """
    import json, sys
    import torch
    from pytest_rollout_golden import load_batch

    load_batch(sys.argv[1])  # warm-up: whatever loading itself imports is imported now
    for path in sys.argv[2:]:
        before = set(sys.modules)
        batch = load_batch(path)
        added = sorted(set(sys.modules) - before)
        print(json.dumps({"added": added, "class": type(batch).__name__, "meta": batch.meta_info}))
    """
)
CRAFTED_NAMES = [
    "torch:_inductor",
    "torch:_dynamo.Something",
    "torch._dynamo:Something",
    "torch:_inductor.config.Something",
    "torch:testing._internal.common_utils.TestCase",
]


def test_a_crafted_class_name_imports_no_module(tmp_path):
    """In a fresh process, so that modules the test process imported cannot hide an import.

    The names are loaded one after another in one process (torch takes seconds to
    import); any import fails the test, and the first name to import a module is
    the one reported with it.
    """
    warm_up = crafted(tmp_path, "nowhere.to.be.found:Nothing", name="warm-up")
    paths = [
        str(crafted(tmp_path, spec, name=f"crafted{i}")) for i, spec in enumerate(CRAFTED_NAMES)
    ]
    result = subprocess.run(
        [sys.executable, "-c", LOAD_AND_COUNT, str(warm_up), *paths],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loads = [json.loads(line) for line in result.stdout.splitlines()[-len(paths) :]]
    imported = {
        spec: out["added"] for spec, out in zip(CRAFTED_NAMES, loads, strict=True) if out["added"]
    }
    assert not imported, {spec: f"{len(a)} modules: {a[:5]}" for spec, a in imported.items()}
    for out in loads:
        assert out["class"] == "RolloutBatch"  # the documented fallback for an unavailable class
        assert out["meta"] == {"step": 1}


def test_a_module_getattr_hook_is_never_called(tmp_path, monkeypatch):
    called: list[str] = []
    hooked = types.ModuleType("prg_hooked_module")
    hooked.__getattr__ = lambda name: called.append(name) or DataProtoLike  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, hooked.__name__, hooked)

    batch = load_batch(crafted(tmp_path, "prg_hooked_module:DataProtoLike"))

    assert called == []
    assert isinstance(batch, codec.RolloutBatch)


@pytest.mark.parametrize("cls", [DataProtoLike, Outer.Inner])
def test_an_imported_class_is_still_rebuilt(tmp_path, cls):
    path = tmp_path / "batch.safetensors"
    save_batch(path, batch_of(cls))
    batch = load_batch(path)
    assert type(batch) is cls
    assert torch.equal(batch.batch["ids"], torch.arange(3))


@pytest.mark.parametrize(
    "spec",
    [
        "builtins:print",  # a callable, not a class
        "builtins:dict",  # a class without the DataProto fields
        f"{__name__}:Outer.Inner.batch",  # a dataclass field, not a class
        f"{__name__}:Outer.Missing",
        f"{__name__}:",
        ":DataProtoLike",
    ],
)
def test_a_name_that_is_not_a_dataproto_class_falls_back(tmp_path, spec):
    batch = load_batch(crafted(tmp_path, spec))
    assert isinstance(batch, codec.RolloutBatch)
    assert batch.meta_info == {"step": 1}
