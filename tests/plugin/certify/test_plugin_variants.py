"""Layout variants through the plugin: the reference records, variants replay with the layout
lane and never record, a shared golden works across files and survives ``--golden-prune``."""

from __future__ import annotations

import shutil
from pathlib import Path

GATE = """
import pytest
from pytest_rollout_golden.parallel import variants

LAYOUTS = variants(tp=[1, 2], pp=[1], dp=[1], packing=[False], micro_batches=[1])

@pytest.mark.golden(shared="policy"{extra})
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gate(golden, values, layout):
    scale = values.get(layout.id, 1.0)
    golden.check({{"pg_loss": 0.5 * scale, "grad_norm": 2.0 * scale}}, step=0)
"""
REF, VARIANT = "tp1-pp1-dp1-padded-mb1", "tp2-pp1-dp1-padded-mb1"


def test_reference_records_variant_replays_and_is_never_recorded(project):
    project.write(GATE.format(extra=""))
    result = project.run("-v")
    result.assert_outcomes(passed=2)
    assert project.counts(result)["recorded"] == 1 and project.counts(result)["replayed"] == 1
    order = [x for x in result.outlines if "::test_gate[" in x and "PASSED" in x]
    assert REF in order[0] and VARIANT in order[1]  # the reference runs first
    assert (project.golden / "@shared" / "policy" / "manifest.json").is_file()
    before = project.golden_files()
    result = project.run("--update-golden")  # the variant still only replays
    result.assert_outcomes(passed=2)
    assert project.counts(result)["updated"] == 1 and project.counts(result)["replayed"] == 1
    assert set(project.golden_files()) == set(before)


def test_perturbed_variant_fails_naming_metric_and_variant(project):
    project.write(GATE.format(extra=""))
    project.run().assert_outcomes(passed=2)
    project.set_values(**{VARIANT: 1.001})
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    row = project.mismatch_row(result, "pg_loss")
    assert row["allowed"] == "rtol=0.0001, atol=1e-07 (variant lane)"  # float32 layout lane
    text = result.stdout.str()
    assert f"test_gate[{VARIANT}] against the golden of the reference [{REF}]" in text
    assert f'pytest --update-golden -k "{REF}"' in text


def test_layout_lane_replaces_same_layout_defaults_only_for_variants(project):
    project.write(GATE.format(extra=""))
    project.run().assert_outcomes(passed=2)
    # 3e-5 relative: beyond the layout lane's grad_norm (1e-5), inside the built-in 1e-4
    project.set_values(**{VARIANT: 1.00003, REF: 1.00003})
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    assert project.mismatch_row(result, "grad_norm")["allowed"] == (
        "rtol=1e-05, atol=1e-07 (variant lane)"
    )
    failed = [x for x in result.outlines if x.startswith("FAILED")]
    assert len(failed) == 1 and f"test_gate[{VARIANT}]" in failed[0]


def test_user_marker_tolerances_still_apply_to_variants(project):
    project.write(GATE.format(extra=', tolerances={"*": {"rtol": 0.01}}'))
    project.run().assert_outcomes(passed=2)
    project.set_values(**{VARIANT: 1.001})  # beyond the lane, within the user's own 1e-2
    project.run().assert_outcomes(passed=2)


def test_missing_reference_golden_fails_naming_reference_and_command(project):
    project.write(GATE.format(extra=""))
    result = project.run("-k", VARIANT)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert f"only replays the golden of the reference [{REF}]" in text
    assert f'`pytest --update-golden -k "{REF}"`' in text
    assert not project.golden.exists()  # nothing recorded, even in auto mode
    result = project.run("--update-golden", "-k", VARIANT)
    result.assert_outcomes(failed=1)
    assert not project.golden.exists()


A_FILE = """
import pytest

@pytest.mark.golden(shared="policy")
def test_reference(golden):
    golden.check({"pg_loss": 0.5}, step=0)
"""
B_FILE = """
import pytest
from pytest_rollout_golden.parallel import Layout, layout_params

@pytest.mark.golden(shared="policy")
@pytest.mark.parametrize("layout", layout_params([Layout(dp=2)])[1:])
def test_variant(golden, values, layout):
    golden.check({"pg_loss": 0.5 * values.get("scale", 1.0)}, step=0)
"""


def test_shared_golden_across_files_and_prune(project):
    project.write(A_FILE, "test_a")
    project.write(B_FILE, "test_b")
    project.write("def test_other():\n    pass\n", "test_c")
    project.run("test_a.py").assert_outcomes(passed=1)
    shared = project.golden / "@shared" / "policy"
    assert (shared / "manifest.json").is_file()
    project.run("test_b.py").assert_outcomes(passed=1)  # another file replays it
    project.set_values(scale=1.01)
    project.run("test_b.py").assert_outcomes(failed=1)
    project.set_values(scale=1.0)
    # A run that collects no test naming it, but not the recorder's file either: kept.
    project.run("test_c.py", "--golden-prune").assert_outcomes(passed=1)
    assert shared.is_dir()
    project.run("--golden-prune").assert_outcomes(passed=3)  # named: used
    assert shared.is_dir()
    Path(project.path / "test_b.py").unlink()
    Path(project.path / "test_a.py").write_text("def test_reference():\n    pass\n")
    result = project.run("--golden-prune")  # shared: kept unless asked for explicitly
    result.assert_outcomes(passed=2)
    assert shared.is_dir()
    result = project.run("--golden-prune-tests")  # the recorder's file, fully collected, no user
    result.assert_outcomes(passed=2)
    assert not shared.exists()
    assert not (project.golden / "@shared").exists() or not any(
        (project.golden / "@shared").iterdir()
    )


def test_shared_and_key_exclude_each_other(project):
    project.write(
        "import pytest\n@pytest.mark.golden(shared='a', key='b')\n"
        "def test_x(golden):\n    golden.check({'x': 1.0})\n"
    )
    result = project.run()
    assert "key= and shared= exclude each other" in result.stdout.str() + result.stderr.str()


FAULTS_FILE = """
import pytest
from pytest_rollout_golden.parallel import Layout, layout_params
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

CFG = PolicyConfig()
FAULTY = [
    Layout(tp=2, micro_batches=4, fault="no-tp-allreduce"),
    Layout(micro_batches=4, fault="micro-mean"),
    Layout(dp=2, micro_batches=4, fault="dp-double-norm"),
    Layout(packing=True, micro_batches=4, fault="packing-leak"),
]

@pytest.mark.golden(shared="parallel-policy-float32")
@pytest.mark.parametrize("layout", layout_params(FAULTY)[1:])
def test_gate(golden, layout):
    batches = [golden.rollout(lambda s=s: make_rollout(CFG, s), step=s) for s in range(3)]
    for step, result in enumerate(run(layout, CFG, batches)):
        check_step(golden, result, step=step)
"""


def run_faults(project, source: str, goldens: list[str], failed: int) -> list[str]:
    """Run ``source`` against copies of the committed shared goldens; the failure sections."""
    for name in goldens:
        committed = Path(__file__).parents[3] / "golden" / "@shared" / name
        shutil.copytree(committed, project.golden / "@shared" / name)
    project.write(source)
    result = project.run()
    result.assert_outcomes(failed=failed)
    sections = result.stdout.str().split("_ test_")[1:]
    assert len(sections) == failed
    return sections


def assert_names_metric(sections: list[str], fault: str, metric: str) -> str:
    """The section of the variant ending in ``fault`` fails ``metric`` at step 0."""
    section = next(s for s in sections if s.split("]", 1)[0].endswith(fault))
    rows = [line.split() for line in section.splitlines() if line.startswith("  ")]
    assert any(r[:2] == [metric, "0"] for r in rows), (fault, section)
    return section


def test_each_wrong_variant_fails_against_the_committed_golden_naming_metric_and_variant(
    project,
):
    """The real reference golden of test_parallel_gate.py, the real model, four real bugs."""
    sections = run_faults(project, FAULTS_FILE, ["parallel-policy-float32"], failed=4)
    for fault, metric in [
        ("no-tp-allreduce", "pg_loss"),
        ("micro-mean", "pg_loss"),
        ("dp-double-norm", "grad_norm"),
        ("packing-leak", "pg_loss"),
    ]:
        section = assert_names_metric(sections, fault, metric)
        variant_id = section.split("]", 1)[0].removeprefix("gate[")
        assert f"test_gate[{variant_id}] against the golden of the reference" in section


ROUND2_FAULTS_FILE = """
import pytest
from pytest_rollout_golden.parallel import Layout, layout_params
from pytest_rollout_golden.parallel.policy import PolicyConfig, check_step, make_rollout, run

DENSE, MOE = PolicyConfig(), PolicyConfig(experts=4)

def gate(golden, layout, cfg):
    batches = [golden.rollout(lambda s=s: make_rollout(cfg, s), step=s) for s in range(3)]
    for step, result in enumerate(run(layout, cfg, batches)):
        check_step(golden, result, step=step)

DENSE_FAULTS = [
    Layout(cp=2, fault="ring-no-causal"),
    Layout(sp=2, fault="ulysses-head-split"),
    Layout(max_tokens=16, fault="micro-mean"),
]

@pytest.mark.golden(shared="parallel-policy-float32")
@pytest.mark.parametrize("layout", layout_params(DENSE_FAULTS)[1:])
def test_gate(golden, layout):
    gate(golden, layout, DENSE)

@pytest.mark.golden(shared="parallel-moe-float32")
@pytest.mark.parametrize("layout", layout_params([Layout(ep=2, fault="ep-local-aux")])[1:])
def test_moe_gate(golden, layout):
    gate(golden, layout, MOE)
"""


def test_round_two_wrong_variants_fail_against_the_committed_goldens_naming_the_metric(project):
    """Ring attention without the causal mask across chunks, Ulysses scattering the wrong
    dimension, a dynamic-batch loss weighted by 1/len(micro_batches), router statistics
    per EP rank: each fails against the real reference golden, naming what moved."""
    goldens = ["parallel-policy-float32", "parallel-moe-float32"]
    sections = run_faults(project, ROUND2_FAULTS_FILE, goldens, failed=4)
    for fault, metric in [
        ("ring-no-causal", "pg_loss"),
        ("ulysses-head-split", "pg_loss"),
        ("dyn16-micro-mean", "pg_loss"),
        ("ep-local-aux", "aux_loss"),
    ]:
        assert_names_metric(sections, fault, metric)


def test_variant_checking_a_step_the_reference_never_recorded_names_the_reference(project):
    project.write(
        """
import pytest
from pytest_rollout_golden.parallel import variants

LAYOUTS = variants(tp=[1, 2], pp=[1], dp=[1], packing=[False], micro_batches=[1])

@pytest.mark.golden(shared="policy")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gate(golden, values, layout):
    steps = 2 if layout.tp == 2 and values.get("more") else 1
    for step in range(steps):
        golden.check({"pg_loss": 0.5}, step=step)
"""
    )
    project.run().assert_outcomes(passed=2)
    project.set_values(more=True)
    result = project.run("-k", VARIANT)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "step 1 was never recorded (recorded steps: [0])" in text
    assert f'record it by running the reference: `pytest --update-golden -k "{REF}"`' in text


def test_a_torchrun_rank_above_0_replays_a_private_copy_and_removes_only_it(
    project, monkeypatch, tmp_path
):
    # Every rank of `torchrun -m pytest` runs the same tests; only rank 0 may write golden/.
    project.write(A_FILE, "test_a")
    project.run().assert_outcomes(passed=1)
    before = project.golden_files()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (scratch / "someone-elses-file").write_text("keep")
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    project.write(A_FILE.replace("0.5", "0.75"), "test_a")
    result = project.run("--update-golden")  # even the update flag cannot write from rank 1
    result.assert_outcomes(failed=1)
    assert project.golden_files() == before
    assert sorted(p.name for p in scratch.iterdir()) == ["someone-elses-file"]
