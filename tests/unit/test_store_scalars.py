"""A batch that is one scalar (int, float, bool, None, str) round-trips exactly (issue 17, 6)."""

from __future__ import annotations

import math
import struct

import pytest

from pytest_rollout_golden import load_batch, save_batch

SCALARS = [0, -7, 2**70, 1.5, -0.0, 1e-310, float("inf"), True, False, None, "", "tokens"]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_top_level_scalar_round_trips_with_its_type_and_bits(tmp_path, value):
    save_batch(tmp_path / "b.safetensors", value)
    back = load_batch(tmp_path / "b.safetensors")
    assert type(back) is type(value)
    if isinstance(value, float):
        assert struct.pack("<d", back) == struct.pack("<d", value)
    else:
        assert back == value


def test_top_level_nan_round_trips(tmp_path):
    save_batch(tmp_path / "b.safetensors", float("nan"))
    assert math.isnan(load_batch(tmp_path / "b.safetensors"))


def test_golden_rollout_of_scalars_records_and_replays(project):
    project.write(
        """
        import math

        import pytest

        VALUES = {"int": 3, "float": 0.1, "bool": True, "none": None, "str": "x", "nan": math.nan}


        @pytest.mark.parametrize("name", sorted(VALUES))
        def test_scalar(golden, generated, name):
            got = golden.rollout(lambda: generated(name, VALUES[name]))
            want = VALUES[name]
            assert type(got) is type(want)
            assert got == want or (name == "nan" and math.isnan(got))
        """
    )
    project.run().assert_outcomes(passed=6)
    assert sorted(project.calls()) == ["bool", "float", "int", "nan", "none", "str"]
    project.run("--golden-strict").assert_outcomes(passed=6)
    assert project.calls() == [], "replay must not generate"
