"""The accumulation sweep passes correct training steps on 100 seeds and catches each broken one."""

from __future__ import annotations

import re

import pytest
import torch
from accumulation_steps import (
    BROKEN,
    CORRECT,
    DoubleDivisionStep,
    InterleavedAdvantagesStep,
    SampleWeightedMeanStep,
    TokenMeanStep,
    UnscaledSumStep,
    ZeroGradInLoopStep,
    distinct_batch,
    ragged_batch,
)
from hunting import finds, hunt, passes
from hypothesis import given, strategies as st

from pytest_rollout_golden.invariants import (
    AccumulationSetting,
    accumulation_settings,
    check_accumulation_invariance,
)
from pytest_rollout_golden.invariants.accumulation import accumulation_grid

SEEDS = range(100)


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors of a few dozen entries: handing each op to a second thread costs ten times
    the op on the shared 2-core machine."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def failure(step, batch, **options) -> str:
    with pytest.raises(AssertionError) as raised:
        check_accumulation_invariance(step, batch, **options)
    return str(raised.value)


# --------------------------------------------------------------------------- settings


def test_the_grid_cuts_the_batch_into_micro_batches_of_1_2_and_b_rows():
    grid = [(s.micro_batch_size, s.accumulation_steps, s.steps_per_generation) for s in
            accumulation_grid(4)]  # fmt: skip
    assert grid == [(1, 1, 4), (1, 2, 4), (1, 4, 4), (2, 1, 2), (2, 2, 2), (4, 1, 1)]
    odd = {s.micro_batch_size for s in accumulation_grid(3)}
    assert odd == {1, 3}  # 2 does not divide 3 rows: left out


def test_a_setting_knows_its_schedule_and_baseline():
    setting = AccumulationSetting(micro_batch_size=1, accumulation_steps=2, steps_per_generation=4)
    assert setting.rows == 4 and setting.optimizer_steps == 2
    assert setting.schedule() == [[range(0, 1), range(1, 2)], [range(2, 3), range(3, 4)]]
    assert setting.baseline() == AccumulationSetting(2, 1, 2)
    assert str(setting) == (
        "micro-batch 1 × accumulation 2 (4 micro-batches per generation, 2 optimizer steps)"
    )


# --------------------------------------------------------------------------- correct steps


@pytest.mark.parametrize("step", CORRECT, ids=lambda cls: cls.__name__)
def test_correct_steps_pass_on_100_seeds(step):
    false_alarms = []
    for seed in SEEDS:
        try:
            check_accumulation_invariance(step(), ragged_batch(seed))
        except AssertionError as error:
            false_alarms.append(f"seed {seed}: {error}")
    assert false_alarms == []


# --------------------------------------------------------------------------- broken steps


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_step_is_caught_on_every_seed(name):
    missed = []
    for seed in SEEDS:
        try:
            check_accumulation_invariance(BROKEN[name](), distinct_batch(seed))
        except AssertionError as error:
            assert str(error).startswith("[accumulation_invariance] baseline micro-batch ")
        else:
            missed.append(seed)
    assert missed == []


def first_line(message: str) -> str:
    return message.splitlines()[0]


def test_the_message_names_the_pair_the_result_its_difference_and_the_ratio():
    message = failure(DoubleDivisionStep(), distinct_batch(0), micro_batch_sizes=[1])
    assert first_line(message).startswith(
        "[accumulation_invariance] baseline micro-batch 8 × accumulation 1 (1 micro-batch per "
        "generation, 1 optimizer step) vs micro-batch 1 × accumulation 8 (8 micro-batches per "
        "generation, 1 optimizer step): 5 of 5 results differ (grad/embedding, grad/head, "
    )
    head = next(line for line in message.splitlines() if line.strip().startswith("grad/head"))
    assert re.search(r"grad/head: largest difference [\d.e-]+ at \(\d, \d\): setting=", head)
    assert re.search(r"[\d.e+]+x the bound [\d.e-]+ \(atol 1e-12 \+ rtol 1e-09 ·", head)
    assert "grad/head is 0.125x the baseline's: a double division by accumulation steps?" in head


@pytest.mark.parametrize(
    ("step", "size", "explained"),
    [
        (DoubleDivisionStep, 2, "is 0.5x the baseline's: a double division by accumulation steps?"),
        (UnscaledSumStep, 2, "is 2x the baseline's: micro-batch losses summed without dividing"),
        (ZeroGradInLoopStep, 1, "every entry is 0: were the gradients dropped"),
    ],
)
def test_a_simple_ratio_is_explained(step, size, explained):
    batch = distinct_batch(11)  # 4 rows of 8, 1, 5 and 0 valid tokens
    assert batch["response_mask"].sum(-1).tolist() == [8, 1, 5, 0]
    setting = AccumulationSetting(size, 4 // size, 4 // size)
    message = failure(step(), batch, settings=[setting])
    assert f"vs micro-batch {size} × accumulation {4 // size}" in message
    assert explained in message


@pytest.mark.parametrize("step", [SampleWeightedMeanStep, InterleavedAdvantagesStep])
def test_a_misweighted_or_misaligned_step_is_not_given_a_ratio_it_does_not_have(step):
    message = failure(step(), distinct_batch(11), settings=[AccumulationSetting(2, 2, 2)])
    assert "grad/head: largest difference" in message and "grad/head is" not in message


def test_more_optimizer_steps_than_one_per_generation_are_compared_step_for_step():
    setting = AccumulationSetting(1, 2, 4)  # steps_per_generation 4 != accumulation 2
    message = failure(DoubleDivisionStep(), distinct_batch(11), settings=[setting])
    assert first_line(message).startswith(
        "[accumulation_invariance] baseline micro-batch 2 × accumulation 1 (2 micro-batches per "
        "generation, 2 optimizer steps) vs micro-batch 1 × accumulation 2 (4 micro-batches per "
        "generation, 2 optimizer steps)"
    )
    check_accumulation_invariance(TokenMeanStep(), distinct_batch(11), settings=[setting])


# --------------------------------------------------------------------------- hypothesis option


@passes(25)
@given(seed=st.integers(0, 10**6), data=st.data())
def test_correct_steps_pass_on_drawn_settings(seed, data):
    step = CORRECT[seed % len(CORRECT)]()
    check_accumulation_invariance(step, ragged_batch(seed), data=data)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_drawn_settings_catch_each_broken_step(name):
    @hunt
    @given(seed=st.integers(0, 10**6), data=st.data())
    def run(seed, data):
        check_accumulation_invariance(BROKEN[name](), distinct_batch(seed), data=data)

    with finds("accumulation_invariance"):
        run()


def test_drawn_settings_go_beyond_the_grid():
    seen: set[AccumulationSetting] = set()

    def step(batch, setting):
        seen.add(setting)
        return TokenMeanStep()(batch, setting)

    @passes(30)
    @given(data=st.data())
    def run(data):
        check_accumulation_invariance(step, ragged_batch(0, rows=(6,)), data=data)

    run()
    grid = set(accumulation_grid(6))
    assert any(s.micro_batch_size == 3 for s in seen) and seen - grid


@given(st.data())
@passes(20)
def test_the_strategy_draws_settings_that_cut_the_batch_whole(data):
    size = data.draw(st.integers(1, 12))
    setting = data.draw(accumulation_settings(size))
    assert setting.rows == size and setting.steps_per_generation % setting.accumulation_steps == 0


# --------------------------------------------------------------------------- bad arguments


def first_row(batch):
    return {key: value[:1] for key, value in batch.items()}


def step_returning(results):
    return lambda batch, setting: results


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda b: check_accumulation_invariance(None, b), TypeError, "step must be callable"),
        (lambda b: check_accumulation_invariance(TokenMeanStep(), [b]), TypeError, "a dict"),
        (
            lambda b: check_accumulation_invariance(TokenMeanStep(), first_row(b)),
            ValueError,
            "1 row(s): it cannot be cut",
        ),
        (
            lambda b: check_accumulation_invariance(TokenMeanStep(), {**b, "x": torch.ones(3)}),
            ValueError,
            "share their first dimension",
        ),
        (
            lambda b: check_accumulation_invariance(TokenMeanStep(), b, micro_batch_sizes=[3]),
            ValueError,
            "none of micro_batch_sizes=[3]",
        ),
        (
            lambda b: check_accumulation_invariance(TokenMeanStep(), b, accumulation_steps=[0]),
            ValueError,
            "accumulation_steps must hold ints >= 1",
        ),
        (
            lambda b: check_accumulation_invariance(
                TokenMeanStep(), b, settings=[AccumulationSetting(1, 1, 3)]
            ),
            ValueError,
            "consuming the batch's 4 rows",
        ),
        (
            lambda b: check_accumulation_invariance(
                TokenMeanStep(), b, micro_batch_sizes=[1], settings=[]
            ),
            ValueError,
            "pass one of",
        ),
        (
            lambda b: check_accumulation_invariance(TokenMeanStep(), b, rtol=-1.0),
            ValueError,
            "rtol must be a finite number",
        ),
        (lambda b: AccumulationSetting(2, 3, 4), ValueError, "not a multiple of accumulation"),
        (lambda b: AccumulationSetting(0, 1, 1), ValueError, "micro_batch_size must be an int"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_arguments_say_what_is_wrong(call, error, says):
    batch = distinct_batch(11)
    with pytest.raises(error, match=re.escape(says)):
        call(batch)


@pytest.mark.parametrize(
    ("results", "invariant", "says"),
    [
        ([1.0], "accumulation_invariance.results", "must return a non-empty mapping"),
        ({}, "accumulation_invariance.results", "must return a non-empty mapping"),
        ({"loss": torch.ones((), dtype=torch.float32)}, "accumulation_invariance.dtype", "float32"),
        ({"loss": torch.tensor(torch.nan, dtype=torch.float64)}, "accumulation_invariance.finite",
         "loss is not finite"),
    ],
)  # fmt: skip
def test_a_step_returning_the_wrong_thing_is_named(results, invariant, says):
    with finds(invariant) as raised:
        check_accumulation_invariance(step_returning(results), distinct_batch(11))
    assert says in str(raised.value)


def test_results_that_change_names_or_shapes_with_the_setting_are_named():
    def step(batch, setting):
        grad = torch.zeros(setting.micro_batch_size, dtype=setting.dtype)
        return {"grad": grad} if setting.accumulation_steps == 1 else {"grad": grad, "extra": 1.0}

    message = failure(step, distinct_batch(11), settings=[AccumulationSetting(2, 2, 2)])
    assert "[accumulation_invariance.results]" in message and "'extra'" in message
    message = failure(
        lambda batch, setting: {"grad": torch.zeros(setting.micro_batch_size, dtype=setting.dtype)},
        distinct_batch(11),
        settings=[AccumulationSetting(2, 2, 2)],
    )
    assert "grad has shape (2,), the baseline's (4,)" in message


def test_a_step_editing_its_batch_in_place_changes_neither_the_batch_nor_other_runs():
    batch = distinct_batch(11)
    before = {key: value.clone() for key, value in batch.items()}

    def step(micro_batch, setting):
        results = TokenMeanStep()(micro_batch, setting)
        micro_batch["advantages"].mul_(2.0)
        return results

    check_accumulation_invariance(step, batch)
    assert all(torch.equal(batch[key], before[key]) for key in batch)
