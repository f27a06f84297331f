"""A metric that cancels to zero (RLOO's loss): its failure says so, with the line to add."""

from __future__ import annotations

TRAIN = """
def test_step(golden, values):
    for step, loss in enumerate(values["loss"]):
        golden.check({"loss": loss, "grad_norm": 2.0}, step=step)
"""


def test_a_value_at_rounding_level_fails_with_the_remedy_and_the_remedy_works(project):
    project.write(TRAIN)
    project.set_values(loss=[3.7e-9, -1.1e-8])  # -mean(centred advantages): rounding only
    project.run().assert_outcomes(passed=1)

    project.set_values(loss=[3.7e-9, 5.6e-8])  # a same-math change moves the rounding
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(
        [
            "note: loss is at most 1.1e-08 over every recorded step: the rounding level of "
            "float32 terms of order 1, not a value of its own; *golden_tolerances = "
            "loss:atol=1e-6 (or loss:scale=1.0)"
        ]
    )
    project.pytester.makeini("[pytest]\ngolden_tolerances = loss:atol=1e-6\n")
    project.run("--golden-strict").assert_outcomes(passed=1)
    project.set_values(loss=[3.7e-9, 0.076])  # loss over padding: a real change
    project.run("--golden-strict").assert_outcomes(failed=1)


def test_a_value_of_its_own_gets_no_such_note(project):
    project.write(TRAIN)
    project.set_values(loss=[0.3, 0.2])
    project.run().assert_outcomes(passed=1)
    project.set_values(loss=[0.3, 0.2003])
    failed = project.run("--golden-strict")
    failed.assert_outcomes(failed=1)
    assert "rounding level" not in failed.stdout.str()
