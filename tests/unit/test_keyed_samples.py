"""The keyed-samples form of a rollout: a total order over keys, duplicates refused, the
completion order kept, and a stored value that is not one refused."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.golden import keyed


def test_samples_sort_by_key_ints_before_strings_and_tuples_element_by_element():
    samples = [{"k": k} for k in [("b", 1), 3, "a", ("a", 2), ("a", 10), 1]]
    stored = keyed.collect(samples, lambda s: s["k"], "rollout 'r' at step 0")
    assert stored["keys"] == [1, 3, "a", ("a", 2), ("a", 10), ("b", 1)]
    assert keyed.ordered(stored, "recorded", "", "") == samples
    assert [s["k"] for s in keyed.ordered(stored, "key", "", "")] == stored["keys"]


def test_a_list_key_counts_as_the_tuple_it_spells():
    stored = keyed.collect([{"k": ["u", 1]}, {"k": ["u", 0]}], lambda s: s["k"], "r")
    assert stored["keys"] == [("u", 0), ("u", 1)] and stored["completed"] == [1, 0]


@pytest.mark.parametrize("bad", [1.5, None, True, {"a": 1}, ("u", 0.5)])
def test_a_key_that_cannot_be_ordered_is_refused_naming_the_sample(bad):
    with pytest.raises(TypeError, match=r"r: sample 1: a key is a str, an int or a tuple"):
        keyed.collect([0, 1], lambda s: "x" if s == 0 else bad, "r")


def test_duplicate_keys_are_refused_naming_both_samples():
    with pytest.raises(ValueError, match=r"r: samples 0 and 2 have the same key \('u', 0\)"):
        keyed.collect(["a", "b", "c"], lambda s: ("u", 0 if s != "b" else 1), "r")


@pytest.mark.parametrize(
    "stored",
    [
        [1, 2],
        {"format": "keyed-samples", "keys": [1], "samples": [1, 2], "completed": [0, 1]},
        {"format": "keyed-samples", "keys": [1, 2], "samples": [1, 2], "completed": [0, 0]},
    ],
)
def test_a_stored_value_that_is_not_keyed_samples_is_refused_with_the_remedy(stored):
    with pytest.raises(ValueError, match=r"not golden\.rollout_samples.*the remedy"):
        keyed.ordered(stored, "key", "rollout 'r' at step 0", "the remedy")


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order= is 'key' or 'recorded'"):
        keyed.check_order("completion")


def test_by_key_names_each_sample_by_its_key_and_leaves_the_completion_order_out():
    stored = keyed.collect([{"v": 1}, {"v": 0}], lambda s: ("u", s["v"]), "r")
    again = keyed.collect([{"v": 0}, {"v": 1}], lambda s: ("u", s["v"]), "r")
    assert stored != again  # recorded in another completion order
    view = {"format": "keyed-samples", "samples": {"('u', 0)": {"v": 0}, "('u', 1)": {"v": 1}}}
    assert keyed.by_key(stored) == keyed.by_key(again) == view
    assert keyed.by_key(stored, completion=True)["completed"] == ["('u', 1)", "('u', 0)"]
    not_keyed = {"format": "other", "samples": [1]}
    assert keyed.by_key(not_keyed) is not_keyed
    twice = {"format": "keyed-samples", "keys": [[1], (1,)], "samples": [0, 1], "completed": [0, 1]}
    assert keyed.by_key(twice) is twice  # two keys, one label: left by position
