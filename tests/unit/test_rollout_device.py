"""``golden.rollout(..., device=)``: a replayed batch lands on the test's device."""

from __future__ import annotations

from pathlib import Path

import torch

from pytest_rollout_golden import Golden, Mode


def _batch() -> dict:
    return dict(
        ids=torch.arange(6).reshape(2, 3),
        extra={"logp": torch.linspace(-1, 0, 3), "tags": ["a", "b"]},
        pair=(torch.ones(2), 3),
    )


def _ask(directory: Path, mode: Mode, device: str | None) -> object:
    with Golden(directory, mode=mode) as golden:
        return golden.rollout(_batch, device=device)


def test_recorded_and_replayed_batches_go_to_the_device_asked_for(tmp_path: Path):
    # "meta" is a device every torch build has: the test runs without an accelerator
    for mode in (Mode.AUTO, Mode.STRICT):
        batch = _ask(tmp_path / "g", mode, "meta")
        assert isinstance(batch, dict)
        assert batch["ids"].device.type == "meta"
        assert batch["extra"]["logp"].device.type == "meta"
        assert batch["extra"]["tags"] == ["a", "b"]
        assert batch["pair"][0].device.type == "meta" and batch["pair"][1] == 3


def test_without_a_device_the_batch_stays_on_the_cpu(tmp_path: Path):
    _ask(tmp_path / "g", Mode.AUTO, None)
    batch = _ask(tmp_path / "g", Mode.STRICT, None)
    assert batch["ids"].device.type == "cpu"
    assert torch.equal(batch["ids"], _batch()["ids"])
