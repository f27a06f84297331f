"""Layouts: ids, rank coordinates, validation, and the params ``variants()`` builds."""

from __future__ import annotations

import itertools

import pytest

from pytest_rollout_golden.parallel import Layout, variants
from pytest_rollout_golden.parallel.layout import Place


def ids(params) -> list[str]:
    return [p.id for p in params]


def test_ids_of_round_one_layouts_are_unchanged_and_new_dimensions_append():
    assert Layout(tp=2, packing=True, micro_batches=4).id == "tp2-pp1-dp1-packed-mb4"
    assert Layout(cp=2, ep=2).id == "tp1-pp1-dp1-padded-mb1-cp2-ep2"
    assert Layout(sp=2, max_tokens=64).id == "tp1-pp1-dp1-padded-dyn64-sp2"
    assert Layout(ep=2, fault="ep-local-aux").id == "tp1-pp1-dp1-padded-mb1-ep2-ep-local-aux"


def test_every_rank_has_one_place_tp_fastest_then_sequence_ep_pp_dp():
    layout = Layout(tp=2, pp=2, dp=2, cp=2, ep=2)
    places = [layout.place(rank) for rank in range(layout.world_size)]
    assert len(set(places)) == layout.world_size == 32
    assert places[1] == Place(dp=0, pp=0, ep=0, seq=0, tp=1)
    assert places[2] == Place(dp=0, pp=0, ep=0, seq=1, tp=0)
    assert places[4] == Place(dp=0, pp=0, ep=1, seq=0, tp=0)
    assert places[8] == Place(dp=0, pp=1, ep=0, seq=0, tp=0)
    assert places[16] == Place(dp=1, pp=0, ep=0, seq=0, tp=0)
    for rank, place in enumerate(places):
        assert layout.rank_at(place) == rank
        assert layout.coords(rank) == (place.dp, place.pp, place.tp)


def test_round_one_rank_numbering_is_kept():
    layout = Layout(tp=2, pp=2, dp=2)
    for dp, pp, tp in itertools.product(range(2), repeat=3):
        assert layout.rank_of(dp, pp, tp) == (dp * 2 + pp) * 2 + tp


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cp": 2, "sp": 2}, "cannot be combined"),
        ({"max_tokens": 16, "micro_batches": 2}, "leave micro_batches at 1"),
        ({"ep": 0}, "Layout.ep must be an int >= 1"),
        ({"max_tokens": 0}, "Layout.max_tokens must be an int >= 1"),
        ({"fault": "ring-typo"}, "unknown fault"),
    ],
)
def test_impossible_layouts_are_refused_naming_the_field(fields, problem):
    with pytest.raises(ValueError, match=problem):
        Layout(**fields)


def test_sweeping_cp_and_ep_gives_four_layouts_reference_first():
    params = variants(tp=[1], pp=[1], dp=[1], cp=[1, 2], ep=[1, 2])
    assert ids(params) == [
        "tp1-pp1-dp1-padded-mb1",
        "tp1-pp1-dp1-padded-mb1-ep2",
        "tp1-pp1-dp1-padded-mb1-cp2",
        "tp1-pp1-dp1-padded-mb1-cp2-ep2",
    ]
    marks = [p.marks[0].kwargs for p in params]
    assert "layout_tolerances" not in marks[0]
    assert all(m["reference"] == "tp1-pp1-dp1-padded-mb1" for m in marks)
    assert all("layout_tolerances" in m for m in marks[1:])


def test_no_dimension_named_gives_the_standard_matrix():
    assert len(variants()) == 32
    assert all("cp" not in i and "ep" not in i for i in ids(variants()))


def test_combinations_a_layout_cannot_have_are_left_out():
    swept = ids(variants(cp=[1, 2], sp=[1, 2]))
    assert swept == [
        "tp1-pp1-dp1-padded-mb1",
        "tp1-pp1-dp1-padded-mb1-sp2",
        "tp1-pp1-dp1-padded-mb1-cp2",
    ]
    budget = ids(variants(micro_batches=[1, 4], max_tokens=[None, 16]))
    assert budget == [
        "tp1-pp1-dp1-padded-mb1",
        "tp1-pp1-dp1-padded-dyn16",
        "tp1-pp1-dp1-padded-mb4",
    ]


def test_unnamed_dimensions_stay_at_the_reference():
    reference = Layout(packing=True, micro_batches=2)
    swept = [p.values[0] for p in variants(sp=[1, 2], reference=reference)]
    assert swept == [reference, Layout(packing=True, micro_batches=2, sp=2)]


def test_a_dtype_without_a_measured_lane_needs_tolerances_named():
    """bf16 layouts spread as widely as the bugs move (docs/guide/parallel.md): no lane is
    shipped, so a bf16 variant must carry the lane its user measured."""
    with pytest.raises(ValueError, match="no measured layout tolerances for 'bfloat16'"):
        variants(cp=[1, 2], dtype="bfloat16")
    lane = {"pg_loss": {"rtol": 0.3}}
    params = variants(cp=[1, 2], dtype="bfloat16", tolerances=lane)
    assert params[1].marks[0].kwargs["layout_tolerances"] == lane
