"""Unit tests of variants.same_math: the params it builds, ids, the reference, mistakes."""

from __future__ import annotations

import pytest

from pytest_rollout_golden import same_math


def options(param):
    (mark,) = param.marks
    return mark.kwargs


def test_the_reference_comes_first_and_records_the_others_replay_it():
    params = same_math([8, 4, 2], reference=4, ids=lambda v: f"mb{v}")
    assert [p.id for p in params] == ["mb4", "mb8", "mb2"]
    assert [p.values for p in params] == [(4,), (8,), (2,)]
    assert [options(p) for p in params] == [
        {"variant": "mb4", "reference": "mb4"},
        {"variant": "mb8", "reference": "mb4"},
        {"variant": "mb2", "reference": "mb4"},
    ]


def test_a_mapping_gives_ids_and_a_lane_goes_to_the_variants_only():
    lane = {"pg_loss": {"rtol": 1e-3}}
    params = same_math({"padded": {}, "rmpad": {"remove_padding": True}}, tolerances=lane)
    assert [p.id for p in params] == ["padded", "rmpad"]
    assert "layout_tolerances" not in options(params[0])
    assert options(params[1])["layout_tolerances"] == lane


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda: same_math([]), "at least one value"),
        (lambda: same_math([1, 2], ids=["a", "a"]), "unique and non-empty"),
        (lambda: same_math([1, 2], ids=["a"]), "1 ids for 2 values"),
        (lambda: same_math([1, 2], reference=3), "reference 3 is not among"),
        (lambda: same_math({"a": 1}, ids=["b"]), "keys are the ids"),
        (lambda: same_math([8, 80]), "contain one another"),
    ],
)
def test_mistakes_are_refused_with_the_fix(call, problem):
    with pytest.raises((ValueError, TypeError), match=problem):
        call()
