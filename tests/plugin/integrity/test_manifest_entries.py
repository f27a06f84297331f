"""A manifest entry must be a plain file of its own golden: one naming a nested golden's
directory (or a link) is refused naming the manifest, and an update never deletes it."""

from __future__ import annotations

import json

import pytest

from pytest_rollout_golden._internal.golden.golden import Golden
from pytest_rollout_golden._internal.results import Mode
from pytest_rollout_golden.errors import GoldenFormatError


def record(directory, value, mode=Mode.AUTO):
    with Golden(directory, mode=mode) as golden:
        golden.check({"loss": value})


@pytest.fixture
def crafted(tmp_path):
    outer, inner = tmp_path / "golden" / "outer", tmp_path / "golden" / "outer" / "inner"
    record(outer, 1.0)
    record(inner, 2.0)
    manifest = json.loads((outer / "manifest.json").read_text())
    manifest["files"]["inner"] = {"digest": "00", "kind": "metrics"}  # one crafted line
    (outer / "manifest.json").write_text(json.dumps(manifest))
    return outer, inner


def test_replay_refuses_an_entry_that_is_not_a_file_naming_the_manifest(crafted):
    outer, _ = crafted
    with pytest.raises(GoldenFormatError) as exc:
        record(outer, 1.0, Mode.STRICT)
    assert str(outer / "manifest.json") in str(exc.value)
    assert "'inner'" in str(exc.value) and "not a file of this golden" in str(exc.value)


def test_an_update_never_deletes_what_the_crafted_entry_names(crafted):
    outer, inner = crafted
    record(outer, 1.5, Mode.UPDATE)
    assert (inner / "manifest.json").is_file(), "the nested golden survived the update"
    record(inner, 2.0, Mode.STRICT)
    record(outer, 1.5, Mode.STRICT)
