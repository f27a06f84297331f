"""Recorded rollouts are inputs: update keeps them, replay past the recording, record == replay."""

from __future__ import annotations

import json

import pytest
import torch

from pytest_rollout_golden import store
from pytest_rollout_golden.errors import GoldenFormatError

# A rollout engine that is not reproducible: each run's batch depends on values.json "noise".
# The loss depends on the batch and on "scale" (the deliberate change of the training code).
UPDATE = """
import torch


def test_train(golden, generated, values):
    noise = values.get("noise", 0.0)
    for step in range(2):
        batch = golden.rollout(
            lambda: generated(f"rollout{step}", {"x": torch.arange(4.0) + step + noise}),
            step=step,
        )
        golden.check({"pg_loss": float(batch["x"].sum()) * values.get("scale", 1.0)}, step=step)
"""


def rollout_files(project) -> dict[str, bytes]:
    return {k: v for k, v in project.golden_files().items() if "/rollout-" in k}


def test_update_keeps_recorded_rollouts_and_moves_compare_the_same_inputs(project):
    project.write(UPDATE)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout0", "rollout1"]
    rollouts = rollout_files(project)
    assert len(rollouts) == 2

    # Deliberate loss change; the engine would now produce other batches (noise 0.5).
    project.set_values(scale=2.0, noise=0.5)
    updated = project.run("--update-golden")
    updated.assert_outcomes(passed=1)
    assert project.calls() == [], "--update-golden must not call generate for recorded steps"
    assert rollout_files(project) == rollouts, "recorded rollouts must stay byte-identical"
    # Moves against the recorded inputs: step 0 sums 0+1+2+3 = 6, step 1 sums 10; scale 1 -> 2.
    updated.stdout.fnmatch_lines(
        [
            "*pg_loss (step 0): 6 -> 12 (abs 6, rel 1)",
            "*pg_loss (step 1): 10 -> 20 (abs 10, rel 1)",
            "rollout inputs of test_it.py::test_train:",
            "*rollout 'rollout': kept steps 0-1 (recorded inputs replayed*",
        ]
    )
    assert project.metrics("test_train") == {"0": {"pg_loss": 12.0}, "1": {"pg_loss": 20.0}}
    project.run("--golden-strict").assert_outcomes(passed=1)
    assert project.calls() == []

    # --golden-regenerate re-runs the engine and says what changed in each batch.
    regenerated = project.run("--golden-regenerate")
    regenerated.assert_outcomes(passed=1)
    assert project.calls() == ["rollout0", "rollout1"]
    assert rollout_files(project) != rollouts
    regenerated.stdout.fnmatch_lines(
        [
            "rollout inputs of test_it.py::test_train:",
            "*rollout 'rollout' step 0: regenerated, elements differ: x 4 of 4",
            "*rollout 'rollout' step 1: regenerated, elements differ: x 4 of 4",
        ]
    )
    assert project.metrics("test_train") == {"0": {"pg_loss": 16.0}, "1": {"pg_loss": 24.0}}


def test_regenerate_marker_and_key_and_shape_changes_are_reported(project):
    project.write(
        """
import pytest
import torch


@pytest.mark.golden(regenerate=True)
def test_train(golden, generated, values):
    n = values.get("n", 4)
    batch = {"x": torch.zeros(n), "mask": torch.ones(4, dtype=torch.int64)}
    if values.get("extra"):
        batch["extra"] = torch.ones(2)
        batch["mask"] = batch["mask"].to(torch.int32)
    batch = golden.rollout(lambda: generated("rollout", batch))
    golden.check({"pg_loss": float(batch["x"].sum())})
"""
    )
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    project.set_values(n=6, extra=True)
    project.run().assert_outcomes(passed=1)  # without --update-golden, regenerate does nothing
    assert project.calls() == []
    result = project.run("--update-golden")
    result.assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    assert (
        "    rollout 'rollout' step 0: regenerated, keys added: extra; "
        "mask: int64[4] -> int32[4]; x: float32[4] -> float32[6]\n"
    ) in result.stdout.str()


def test_update_repairs_a_damaged_rollout_and_says_so(project):
    project.write(UPDATE)
    project.run().assert_outcomes(passed=1)
    project.calls()
    damaged = project.golden_dir("test_train") / "rollout-rollout-step000001.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    project.run().assert_outcomes(failed=1)
    assert project.calls() == []

    result = project.run("--update-golden")
    result.assert_outcomes(passed=1)
    assert project.calls() == ["rollout1"], "only the damaged step is generated again"
    result.stdout.fnmatch_lines(
        [
            "*rollout 'rollout': kept step 0 (*",
            "*rollout 'rollout' step 1: recorded file damaged (*rollout-rollout-step000001*); "
            "regenerated",
        ]
    )
    project.run("--golden-strict").assert_outcomes(passed=1)


# --------------------------------------------------------------------------- missing steps

FIVE_STEPS = """
import pytest
import torch


@pytest.mark.golden(**POLICY)
def test_train(golden, generated, values):
    for step in range(values.get("steps", 3)):
        batch = golden.rollout(
            lambda: generated(f"rollout{step}", {"x": torch.full((3,), float(step))}), step=step
        )
        golden.check({"pg_loss": float(batch["x"].sum())}, step=step)
"""


def five_steps(project, policy: str | None) -> None:
    marker = {} if policy is None else {"missing_step": policy}
    project.write(FIVE_STEPS.replace("**POLICY", f"**{marker!r}"))


def test_repeat_replays_the_nearest_recorded_step_below(project):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout0", "rollout1", "rollout2"]
    recorded = project.golden_files()

    five_steps(project, "repeat")
    project.set_values(steps=5)
    result = project.run("--golden-strict")  # repeat never records; strict is fine with it ...
    assert project.calls() == []
    result.stdout.fnmatch_lines(
        [
            "*rollout 'rollout' step 3: step 2 stood in for it (missing_step='repeat'; "
            "recorded steps 0-2)",
            "*rollout 'rollout' step 4: step 2 stood in for it*",
        ]
    )
    result.assert_outcomes(failed=1)  # ... but the metrics of steps 3-4 were never recorded
    assert project.golden_files() == recorded

    result = project.run()  # outside strict mode they are recorded, computed on step 2's batch
    result.assert_outcomes(passed=1)
    assert project.calls() == []
    metrics = project.metrics("test_train")
    assert [metrics[str(s)]["pg_loss"] for s in range(5)] == [0.0, 3.0, 6.0, 6.0, 6.0]
    assert {k: v for k, v in project.golden_files().items() if "rollout-" in k} == {
        k: v for k, v in recorded.items() if "rollout-" in k
    }
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_repeat_takes_the_smallest_step_above_when_none_is_below(project):
    project.write(
        """
import pytest
import torch


@pytest.mark.golden(missing_step="repeat")
def test_train(golden, generated, values):
    for step in values.get("steps", [2]):
        batch = golden.rollout(
            lambda: generated("rollout", {"x": torch.full((2,), 7.0 + step)}), step=step
        )
        golden.check({"pg_loss": float(batch["x"].sum())}, step=step)
"""
    )
    project.run().assert_outcomes(passed=1)  # nothing recorded yet: recorded as always
    assert project.calls() == ["rollout"]
    project.set_values(steps=[0, 2])
    result = project.run()
    result.assert_outcomes(passed=1)
    assert project.calls() == []
    result.stdout.fnmatch_lines(["*rollout 'rollout' step 0: step 2 stood in for it*"])
    assert project.metrics("test_train") == {"0": {"pg_loss": 18.0}, "2": {"pg_loss": 18.0}}


def test_generate_policy_calls_generate_records_nothing_and_compares_nothing(project):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    project.calls()
    recorded = project.golden_files()

    five_steps(project, "generate")
    project.set_values(steps=5)
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=1)
    assert project.calls() == ["rollout3", "rollout4"]
    assert project.golden_files() == recorded
    result.stdout.fnmatch_lines(
        [
            "*rollout 'rollout' step 3: generated, not recorded (missing_step='generate'); "
            "its metrics and tensors are not compared",
            "*rollout 'rollout' step 4: generated, not recorded*",
            "not compared (excluded on purpose):",
            "*test_it.py::test_train: pg_loss (steps 3-4; missing_step='generate': rollout not "
            "recorded)",
        ]
    )
    project.run().assert_outcomes(passed=1)  # nor outside strict mode
    assert project.golden_files() == recorded


def test_generate_policy_leaves_metrics_recorded_at_that_step_alone(project):
    """A critic rollout recorded at step 0 only, the metrics at steps 0-1."""
    project.write(
        """
import pytest
import torch


@pytest.mark.golden(missing_step="generate")
def test_train(golden, generated, values):
    for step in range(2):
        batch = golden.rollout(lambda: generated(f"a{step}", {"x": torch.ones(2)}), step=step)
        if step in values.get("critic", [0]):
            batch = golden.rollout(
                lambda: generated(f"critic{step}", {"x": torch.ones(2)}), step=step, name="critic"
            )
        golden.check({"pg_loss": float(batch["x"].sum())}, step=step)
"""
    )
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["a0", "critic0", "a1"]
    project.set_values(critic=[0, 1])
    result = project.run("--golden-strict")
    result.assert_outcomes(passed=1)  # step 1's recorded pg_loss is not compared, not "unchecked"
    assert project.calls() == ["critic1"]
    result.stdout.fnmatch_lines(
        ["*pg_loss (step 1; missing_step='generate': rollout not recorded)"]
    )


@pytest.mark.parametrize(
    "how",
    [("marker",), ("--golden-missing-step=error",), ("ini",), ("--golden-strict",)],
)
def test_error_policy_fails_with_the_steps_and_the_remedy(project, how):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    project.calls()
    recorded = project.golden_files()
    five_steps(project, "error" if how[0] == "marker" else None)
    if how[0] == "ini":
        project.pytester.makeini("[pytest]\ngolden_missing_step = error\n")
    project.set_values(steps=5)
    args = [how[0]] if how[0].startswith("--") else []
    result = project.run(*args)
    result.assert_outcomes(failed=1)
    assert project.calls() == []
    assert project.golden_files() == recorded
    source = {
        "marker": "marker missing_step='error'",
        "--golden-missing-step=error": "--golden-missing-step='error'",
        "ini": "ini golden_missing_step='error'",
    }
    if how[0] == "--golden-strict":
        why = "Recording is off (--golden-strict or CI)"
    else:
        why = f"A step beyond the recording is an error here ({source[how[0]]}; 'repeat' or"
    assert (
        "GoldenMissingError: rollout 'rollout' at step 3 is not in the golden "
        "golden/test_it/test_train (recorded steps: [0, 1, 2]). " + why
    ) in result.stdout.str()
    assert "run `pytest --update-golden` locally" in result.stdout.str()
    if how[0] != "--golden-strict":
        fixed = project.run("--update-golden", *args)  # the remedy records the new steps
        fixed.assert_outcomes(passed=1)
        assert project.calls() == ["rollout3", "rollout4"]


def test_update_with_repeat_keeps_the_stand_in_and_records_the_new_metrics(project):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    project.calls()
    rollouts = rollout_files(project)
    project.set_values(steps=5)
    result = project.run("--update-golden", "--golden-missing-step=repeat")
    result.assert_outcomes(passed=1)
    assert project.calls() == []
    assert rollout_files(project) == rollouts, "no rollout written, none dropped"
    result.stdout.fnmatch_lines(
        [
            "*rollout 'rollout': kept steps 0-2 (*",
            "*rollout 'rollout' step 3: step 2 stood in for it*",
        ]
    )
    assert [project.metrics("test_train")[str(s)]["pg_loss"] for s in range(5)] == [
        0.0,
        3.0,
        6.0,
        6.0,
        6.0,
    ]


def test_regenerate_and_strict_exclude_each_other(project):
    five_steps(project, None)
    result = project.run("--golden-regenerate", "--golden-strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*(--golden-regenerate implies --update-golden)*"])


def test_unknown_policy_is_a_usage_error(project):
    five_steps(project, "again")
    result = project.run()
    result.stdout.fnmatch_lines(
        ["*marker missing_step= must be one of record, error, repeat, generate, got 'again'*"]
    )
    result = project.run("--golden-missing-step=again")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# --------------------------------------------------------------------------- record == replay

SAME = """
import json
import pathlib

import numpy as np
import torch


def describe(value):
    if isinstance(value, torch.Tensor):
        return [
            "tensor", str(value.dtype), str(value.device), list(value.shape),
            value.is_contiguous(), value.requires_grad, value.tolist(),
        ]
    if isinstance(value, np.ndarray):
        return ["ndarray", str(value.dtype), list(value.shape), value.tolist()]
    if isinstance(value, dict):
        return [type(value).__name__, {k: describe(v) for k, v in value.items()}]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [describe(v) for v in value]]
    return [type(value).__name__, value]


def make():
    weights = torch.linspace(0, 1, 6, requires_grad=True)
    return {
        "logits": weights.reshape(2, 3).t(),  # a non-contiguous view, requires_grad
        "ids": torch.arange(6).reshape(2, 3)[:, ::2],
        "uid": np.array(["a", "b"], dtype=object),
        "pair": (torch.ones(2, dtype=torch.bfloat16), [1, "x"]),
        "meta": {"n": 2},
    }


def test_train(golden, generated):
    batch = golden.rollout(lambda: generated("rollout", make()))
    out = pathlib.Path(__file__).parent / "described.jsonl"
    with open(out, "a") as f:
        f.write(json.dumps(describe(batch)) + "\\n")
    golden.check({"pg_loss": float(batch["logits"].sum())})
"""


def test_recording_returns_exactly_what_replay_returns(project):
    project.write(SAME)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["rollout"]
    project.run().assert_outcomes(passed=1)
    assert project.calls() == []
    recorded, replayed = (project.path / "described.jsonl").read_text().splitlines()
    assert recorded == replayed
    # What both runs get is the stored form, not the generator's object (a grad-requiring view).
    kind, fields = json.loads(recorded)
    assert kind == "dict"
    assert fields["logits"][:6] == ["tensor", "torch.float32", "cpu", [3, 2], True, False]
    assert fields["ids"][:6] == ["tensor", "torch.int64", "cpu", [2, 2], True, False]
    assert fields["pair"][0] == "tuple" and fields["pair"][1][1][0] == "list"
    assert fields["uid"][:2] == ["ndarray", "object"]


RNG = """
import random

import numpy as np
import pytest
import torch


@pytest.mark.golden(exact=True)
def test_train(golden, generated):
    for step in range(2):
        # The engine samples: it draws from every global stream.
        batch = golden.rollout(
            lambda: generated(
                f"rollout{step}",
                {
                    "x": torch.rand(8),
                    "y": torch.tensor(np.random.rand(8)),
                    "z": torch.tensor([random.random() for _ in range(8)]),
                },
            ),
            step=step,
        )
        # Training draws after the rollout: a shuffle, dropout, python-level sampling.
        order = torch.randperm(8)
        dropped = torch.nn.functional.dropout(batch["x"][order], p=0.5, training=True)
        pick = random.randrange(8) + np.random.randint(8)
        golden.check(
            {
                "pg_loss": float(dropped.sum() + batch["y"].sum() * batch["z"][pick % 8]),
                "first": int(order[0]),
            },
            step=step,
        )
"""


def test_record_then_replay_is_bit_identical_when_training_draws_random_numbers(project):
    project.write(RNG)
    first = project.run()
    first.assert_outcomes(passed=1)
    assert project.calls() == ["rollout0", "rollout1"]
    replay = project.run()
    replay.assert_outcomes(passed=1)  # the exact lane: any drift in pg_loss or the order fails
    assert project.calls() == []
    assert project.counts(replay)["replayed"] == 1


def test_generate_runs_on_its_own_stream_per_name_and_step_and_restores_the_outer_one():
    import random

    import numpy as np

    from pytest_rollout_golden._internal.golden.inputs import generate_forked

    def draws():
        return torch.rand(5), np.random.rand(5), random.random()

    def seeded():
        torch.manual_seed(1)
        np.random.seed(1)
        random.seed(1)

    seeded()
    expected = draws()
    seeded()
    first = generate_forked(draws, name="rollout", step=0)
    after = draws()
    assert torch.equal(after[0], expected[0]) and (after[1] == expected[1]).all()
    assert after[2] == expected[2], "the outer streams are as if generate never ran"
    seeded()
    again = generate_forked(draws, name="rollout", step=0)
    later = generate_forked(draws, name="rollout", step=1)
    other = generate_forked(draws, name="eval", step=0)
    assert torch.equal(first[0], again[0]) and first[2] == again[2], "deterministic"
    assert not torch.equal(first[0], later[0]) and first[2] != later[2], "its own per step"
    assert not torch.equal(first[0], other[0]) and (first[1] != other[1]).all(), "per name"
    assert not torch.equal(first[0], expected[0][:5]), "not the outer stream"


EVERY_STEP = """
import torch


def test_train(golden, generated):
    for step in range(3):
        # generate draws from the global stream; the training code draws nothing
        batch = golden.rollout(lambda: generated("gen", {"ids": torch.randint(0, 99, (8,))}),
                               step=step)
        golden.check({"first": float(batch["ids"][0])}, step=step)
"""


def test_each_recorded_step_gets_its_own_rollout_draws(project):
    project.write(EVERY_STEP)
    project.run().assert_outcomes(passed=1)
    assert project.calls() == ["gen"] * 3
    files = sorted(project.golden_dir("test_train").glob("rollout-*.safetensors"))
    batches = [store.load_batch(f)["ids"] for f in files]
    assert len(batches) == 3
    assert not torch.equal(batches[0], batches[1]) and not torch.equal(batches[1], batches[2])
    project.run("--golden-strict").assert_outcomes(passed=1)  # replay: bit-identical
    assert project.calls() == []


def test_batch_changes_counts_differing_elements_bitwise(tmp_path):
    from pytest_rollout_golden._internal.golden.inputs import batch_changes

    old, new = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    store.save_batch(old, {"x": torch.tensor([0.0, 1.0, float("nan")]), "b": torch.ones(2)})
    store.save_batch(
        new, {"x": torch.tensor([-0.0, 1.0, float("nan")]), "b": torch.ones(2).bfloat16()}
    )
    assert batch_changes(old, new) == "b: float32[2] -> bfloat16[2]; elements differ: x 1 of 3"
    assert batch_changes(old, old) == "identical to the recorded one"


# ------------------------------------------------ values recorded on a stand-in rollout


def manifest(project) -> dict:
    return json.loads((project.golden_dir("test_train") / "manifest.json").read_text())


def test_stand_in_values_are_marked_and_a_failure_against_them_says_so(project):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    assert "stand_ins" not in manifest(project), "no stand-in, no new field"

    five_steps(project, "repeat")
    project.set_values(steps=5)
    project.run().assert_outcomes(passed=1)  # steps 3-4 recorded on step 2's batch
    assert manifest(project)["stand_ins"] == {"3": {"rollout": 2}, "4": {"rollout": 2}}
    assert project.metrics("test_train")["3"] == {"pg_loss": 6.0}
    project.run("--golden-strict").assert_outcomes(passed=1)  # stood in again: the same

    five_steps(project, None)  # now steps 3-4 get rollouts of their own
    project.calls()
    result = project.run()
    result.assert_outcomes(failed=1)
    assert project.mismatch_row(result, "pg_loss")["expected"] == "6.0"
    result.stdout.fnmatch_lines(
        [
            "*step 3: its recorded values were computed with rollout 'rollout' step 2 "
            "standing in for step 3 (missing_step='repeat'); this run used step 3's own "
            "rollout 'rollout'",
            "*step 4: its recorded values were computed with rollout 'rollout' step 2 *",
        ]
    )

    result = project.run("--update-golden")  # re-recorded on their own rollouts
    result.assert_outcomes(passed=1)
    assert "stand_ins" not in manifest(project)
    assert project.metrics("test_train")["3"] == {"pg_loss": 9.0}
    project.run("--golden-strict").assert_outcomes(passed=1)


def test_update_under_repeat_marks_the_stood_in_steps_only(project):
    five_steps(project, None)
    project.run().assert_outcomes(passed=1)
    project.set_values(steps=4)
    result = project.run("--update-golden", "--golden-missing-step=repeat")
    result.assert_outcomes(passed=1)
    assert manifest(project)["stand_ins"] == {"3": {"rollout": 2}}


def test_a_malformed_stand_in_mark_is_a_format_error(tmp_path):
    directory = tmp_path / "golden"
    tx = store.Transaction(directory)
    tx.write_json("metrics.json", {"steps": {}}, kind="metrics")
    tx.commit({"test": "t", "stand_ins": {"3": {"rollout": "two"}}})
    with pytest.raises(GoldenFormatError, match="stand_ins"):
        store.read_manifest(directory)
