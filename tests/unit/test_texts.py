"""Unit tests of the package's texts: the shared wording
(:mod:`~pytest_rollout_golden._internal.wording`), a golden's messages, the session summary,
``diff``'s and the CLI's tables.

The plugin tests check these texts end to end (pytester); here each formatter is
checked on its own, on the corner cases a full run rarely reaches.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from pytest_rollout_golden._internal import wording
from pytest_rollout_golden._internal.golden import messages
from pytest_rollout_golden._internal.pytest_plugin import summary as session_text
from pytest_rollout_golden._internal.pytest_plugin.session import SessionState
from pytest_rollout_golden._internal.report import diff_text
from pytest_rollout_golden._internal.results import Comparison, Outcome, Status, Verdict
from pytest_rollout_golden._internal.tolerance.spec import Tolerance
from pytest_rollout_golden.cli import tables
from pytest_rollout_golden.errors import REMEDY_UPDATE, update_command

TOL = Tolerance(rtol=1e-5, atol=1e-8)
NAN, INF = math.nan, math.inf
BUILT_IN = "rtol=1e-05, atol=1e-08 (built-in default)"


@pytest.mark.parametrize(
    ("value", "digits", "shown"),
    [
        (None, None, "-"),
        (None, 3, "-"),
        (0.1 + 0.2, None, "0.30000000000000004"),  # in full: a 1-ulp drift stays visible
        (0.1 + 0.2, 8, "0.3"),
        (1.0, 8, "1"),
        (0.00123456, 2, "0.0012"),
        (123456789.0, 3, "1.23e+08"),
        (0.0, 3, "0"),
        (NAN, None, "nan"),
        (NAN, 2, "nan"),
        (INF, 3, "inf"),
        (-INF, 8, "-inf"),
        (7, 3, "7"),  # ints are never rounded
        (2**62 + 1, None, str(2**62 + 1)),
        (True, None, "True"),
        ("nan", 8, "nan"),  # JSON's form of NaN reads as NaN
        ({"dtype": "float32", "shape": [2, 3]}, None, "float32[2, 3]"),
    ],
)
def test_number(value, digits, shown):
    assert wording.number(value, digits) == shown


def test_location_names_rank_and_micro_only_when_given():
    assert wording.location(3) == "step 3"
    assert wording.location(1, rank=2, micro=0) == "step 1, rank 2, micro 0"
    assert wording.location(1, micro=4) == "step 1, micro 4"
    c = Comparison("t", 1, Verdict.PASS, kind="tensor", rank=2, micro=0)
    assert wording.where(c) == "step 1, rank 2, micro 0"


@pytest.mark.parametrize(
    ("values", "ranges", "words"),
    [
        ([5], "5", "step 5"),
        ([0, 1, 2], "0-2", "steps 0-2"),
        ([3, 0, 2, 1, 7, 9, 10], "0-3, 7, 9-10", "steps 0-3, 7, 9-10"),
        ([0, 2, 4], "0, 2, 4", "steps 0, 2, 4"),
        ({4, 5}, "4-5", "steps 4-5"),
    ],
)
def test_step_ranges(values, ranges, words):
    assert wording.step_ranges(values) == ranges
    assert wording.steps(values) == words


def test_display_is_relative_to_the_working_directory_or_the_given_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert wording.display(tmp_path / "golden" / "t") == os.path.join("golden", "t")
    assert wording.display(str(tmp_path / "golden")) == "golden"
    root = tmp_path / "project"
    assert wording.display(root / "golden" / "t", relative_to=root) == os.path.join("golden", "t")


def test_table_pads_columns_and_strips_trailing_blanks():
    assert wording.table([("a", "bb", ""), ("ccc", 1, "")], "  ") == ["  a    bb", "  ccc  1"]


def test_every_remedy_is_built_from_one_wording():
    assert REMEDY_UPDATE in messages.DROPPED and REMEDY_UPDATE in messages.IF_RIGHT
    assert messages.DROPPED.startswith("if it was dropped on purpose, ")
    assert messages.IF_RIGHT.startswith("If the new values are right, ")
    assert update_command('-k "ref"') == (
        '`pytest --update-golden -k "ref"` locally and commit the golden/ directory'
    )
    assert REMEDY_UPDATE == "run `pytest --update-golden` locally and commit the golden/ directory"


def outcome(*comparisons: Comparison, **kw) -> Outcome:
    return Outcome(
        "test_it.py::test_train",
        "/p/golden/test_it/test_train",
        comparisons=list(comparisons),
        **kw,
    )


def mismatch_example() -> tuple[Outcome, list[Comparison]]:
    """Two drifts at step 1 and 2, a NaN at step 2, a tensor, a missing metric, an ignored one."""
    default = {"tolerance": TOL, "tolerance_source": "built-in default"}
    drift = Comparison(
        "pg_loss", 2, Verdict.FAIL, expected=0.5, actual=0.5005, abs_diff=5e-4, rel_diff=1e-3,
        excess=49.5, **default,
    )  # fmt: skip
    kl = Comparison(
        "kl", 1, Verdict.FAIL, expected=0.01, actual=0.02, abs_diff=0.01, rel_diff=1.0,
        tolerance=Tolerance(exact=True), tolerance_source="--golden-exact", excess=INF,
    )  # fmt: skip
    nan = Comparison(
        "ent",
        2,
        Verdict.FAIL,
        expected=NAN,
        actual=NAN,
        abs_diff=0.0,
        rel_diff=0.0,
        excess=INF,
        **default,
    )
    tensor = Comparison(
        "actor/lp", 1, Verdict.FAIL, kind="tensor", rank=0, micro=1,
        expected={"shape": [2], "dtype": "float32"}, tolerance=TOL, tolerance_source="ini",
        detail="Mismatched elements: 1 / 2\nGreatest",
    )  # fmt: skip
    missing = Comparison("vf_loss", 0, Verdict.MISSING, detail="recorded but not checked")
    ignored = Comparison("clip", 0, Verdict.IGNORED, tolerance_source="--golden-ignore")
    passed = Comparison("x", 0, Verdict.PASS, tolerance=TOL)
    failures = [drift, kl, nan, tensor, missing]
    return outcome(*failures, ignored, passed, environment_changes=["torch: 2.1 -> 2.2"]), failures


def test_mismatch_message_from_hand_built_comparisons(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, failures = mismatch_example()
    result.directory = str(tmp_path / "golden" / "test_it" / "test_train")
    lines = messages.mismatch_message(result, failures).splitlines()
    assert lines == [
        "golden mismatch: first divergence at step 1: kl inf beyond tolerance, actor/lp; "
        "5 of 7 checks failed "
        f"(golden {os.path.join('golden', 'test_it', 'test_train')})",
        "  metric   step  expected  actual  abs diff  rel diff  beyond  allowed",
        "  kl       1     0.01      0.02    0.01      1         inf     bit-exact",
        "  ent      2     nan       nan     0         0         NaN     " + BUILT_IN,
        "  pg_loss  2     0.5       0.5005  0.0005    0.001     49.5x   " + BUILT_IN,
        "metric 'ent' (step 2): recorded NaN, got NaN (equal_nan is off): "
        + messages.ALLOW_NAN,
        "tensor 'actor/lp' (step 1, rank 0, micro 1), allowed rtol=1e-05, atol=1e-08 (ini):",
        "    Mismatched elements: 1 / 2",
        "    Greatest",
        "metric 'vf_loss' (step 0): recorded but not checked",
        "not compared (excluded on purpose): clip (--golden-ignore)",
        "note: replayed under another environment than recorded: torch: 2.1 -> 2.2",
        messages.IF_RIGHT,
    ]  # fmt: skip


def test_mismatch_message_of_a_replay_only_golden_names_its_recorder():
    result, failures = mismatch_example()
    message = messages.mismatch_message(result, failures[:1], recorder="test_ref", remedy="run ref")
    lines = message.splitlines()
    assert lines[0].startswith(
        "golden mismatch: first divergence at step 2: pg_loss 49.5x beyond tolerance; 1 of 7"
    )
    assert lines[1] == "test_it.py::test_train against the golden of test_ref"
    assert lines[-1] == (
        "This test never records: fix it, or if the reference itself changed on purpose, run ref."
    )
    assert REMEDY_UPDATE not in message


def test_failures_are_ranked_by_how_far_beyond_their_tolerance_they_are():
    """A dropped gradient-accumulation scale shows in grad_norm (1000x beyond); a metric a
    hair beyond its tolerance must not lead the headline."""
    near = Comparison("actor/pg_clipfrac", 0, Verdict.FAIL, expected=0.1, actual=0.1001,
                      abs_diff=1e-4, rel_diff=1e-3, excess=1.5)  # fmt: skip
    far = Comparison("actor/grad_norm", 0, Verdict.FAIL, expected=np.float64(2.0),
                     actual=np.float64(1.0), abs_diff=1.0, rel_diff=0.5, excess=1000.0)  # fmt: skip
    assert messages.first_divergence([near, far]) == (
        "first divergence at step 0: actor/grad_norm 1e+03x beyond tolerance, "
        "actor/pg_clipfrac 1.5x; "
    )
    message = messages.mismatch_message(outcome(near, far), [near, far])
    rows = [line.split()[0] for line in message.splitlines()[2:4]]
    assert rows == ["actor/grad_norm", "actor/pg_clipfrac"]
    assert "np.float64" not in message
    assert message.splitlines()[2].split()[2:4] == ["2.0", "1.0"]


def test_numbers_are_plain_whatever_type_carries_them():
    assert wording.number(np.float64(0.25)) == "0.25"
    assert wording.number(np.float32(0.5)) == "0.5"
    assert wording.number(np.int64(3)) == "3"


def test_first_divergence_ignores_missing_values():
    missing = Comparison("a", 0, Verdict.MISSING)
    assert messages.first_divergence([missing]) == ""
    late = Comparison("b", 3, Verdict.FAIL)
    assert messages.first_divergence([missing, late]) == "first divergence at step 3: b; "


def test_the_headline_names_a_few_of_the_first_step_and_counts_the_rest():
    many = [Comparison(f"m{i}", 0, Verdict.FAIL, excess=float(i + 2)) for i in range(5)]
    assert messages.first_divergence([Comparison("later", 1, Verdict.FAIL, excess=1e6), *many]) == (
        "first divergence at step 0: m4 6x beyond tolerance, m3 5x, m2 4x and 2 more; "
    )


def test_typo_hint_only_for_a_close_name():
    assert "did you mean 'pg_loss'?" in messages.typo_hint("pg_loss", ["pg_los", "kl"])
    assert messages.typo_hint("pg_loss", ["entropy"]) == ""


def test_recorded_and_kept_lines_group_steps_by_name():
    files = {
        "r0": {"kind": "rollout", "name": "rollout", "step": 0},
        "r1": {"kind": "rollout", "name": "rollout", "step": 1},
        "t3": {"kind": "tensors", "name": "actor", "step": 3},
        "metrics.json": {"kind": "metrics"},
    }
    comparisons = [
        Comparison("pg_loss", 0, Verdict.NEW),
        Comparison("kl", 2, Verdict.NEW),
        Comparison("kl", 3, Verdict.PASS),
        Comparison("actor/lp", 3, Verdict.NEW, kind="tensor"),
    ]
    assert messages.recorded_lines(files, True, {}, comparisons) == [
        "rollout 'rollout': steps 0-1",
        "tensors 'actor': step 3",
        "2 metrics: steps 0, 2",
    ]
    # an addition to an existing golden lists only the files it added
    assert messages.recorded_lines(files, False, {"r0": {}, "r1": {}}, []) == [
        "tensors 'actor': step 3"
    ]
    assert messages.kept_lines({"rollout": {0, 1, 2}, "critic": {4}}) == [
        "rollout 'rollout': kept steps 0-2 (recorded inputs replayed; --golden-regenerate "
        "re-runs generate)",
        "rollout 'critic': kept step 4 (recorded inputs replayed; --golden-regenerate re-runs "
        "generate)",
    ]


def session(*outcomes: Outcome) -> SessionState:
    state = SessionState()
    for o in outcomes:
        state.add_outcome(o)
    return state


def update_example() -> SessionState:
    updated = outcome(
        Comparison("pg_loss", 0, Verdict.UPDATED, expected=0.5, actual=0.5005, abs_diff=5e-4,
                   rel_diff=1e-3),
        Comparison("kl", 0, Verdict.UPDATED, expected=0.01, actual=0.01, abs_diff=0.0,
                   rel_diff=0.0),
        Comparison("ent", 0, Verdict.UPDATED, expected=1.0, actual=NAN, abs_diff=NAN,
                   rel_diff=NAN),
        Comparison("actor/lp", 0, Verdict.UPDATED, kind="tensor", rank=1,
                   expected={"shape": [2], "dtype": "float32"},
                   actual={"shape": [2], "dtype": "float32"}, abs_diff=0.5, rel_diff=0.25),
        Comparison("vf", 1, Verdict.NEW, actual=2.0),
        Comparison("clip", 0, Verdict.IGNORED, tolerance_source="--golden-ignore"),
        Comparison("clip", 1, Verdict.IGNORED, tolerance_source="--golden-ignore"),
        Comparison("clip", 3, Verdict.IGNORED, tolerance_source="--golden-ignore"),
        status=Status.UPDATED,
        rollouts=["rollout 'rollout': kept step 0 (...)"],
    )  # fmt: skip
    recorded = Outcome("t.py::test_new", "/p/golden/t/test_new", status=Status.RECORDED,
                       recorded=["3 metrics: steps 0-2"])  # fmt: skip
    failed = Outcome("t.py::test_bad", "/p/golden/t/test_bad", status=Status.FAILED, discarded=True,
                     environment_changes=["torch: 2.1 -> 2.2"])  # fmt: skip
    xfailed = Outcome("t.py::test_x", "/p/golden/t/test_x", status=Status.XFAILED)
    untouched = Outcome("t.py::test_none", "/p/golden/t/test_none")  # never opened: not kept
    return session(updated, recorded, failed, xfailed, untouched)


def test_summary_lines_from_hand_built_outcomes():
    state = update_example()
    assert len(state.outcomes) == 4
    lines = session_text.summary_lines(
        state,
        unused=[Path("/p/golden/old")],
        pruned=[],
        unused_tolerances=["--golden-tolerance 'x'"],
        report_path="r.json",
        relative_to=Path("/p"),
    )
    assert lines == [
        "golden: 0 replayed, 1 recorded, 1 updated, 1 failed, 1 xfailed",
        "updated test_it.py::test_train -> golden/test_it/test_train:",
        "    pg_loss (step 0): 0.5 -> 0.5005 (abs 0.0005, rel 0.001)",
        "    kl (step 0): unchanged",
        "    ent (step 0): 1 -> nan (NaN: replay fails unless equal_nan)",
        "    actor/lp (step 0, rank 1): changed (greatest abs 0.5, rel 0.25)",
        "    vf (step 1): new",
        "rollout inputs of test_it.py::test_train:",
        "    rollout 'rollout': kept step 0 (...)",
        "recorded t.py::test_new -> golden/t/test_new:",
        "    3 metrics: steps 0-2",
        "not recorded (the test failed): new values of t.py::test_bad",
        "replayed under another environment than recorded (exact lane not applied):",
        "    t.py::test_bad: torch: 2.1 -> 2.2",
        "not compared (excluded on purpose):",
        "    test_it.py::test_train: clip (steps 0-1, 3; --golden-ignore)",
        "unused golden directories (delete with --golden-prune on a full run):",
        "    golden/old",
        "tolerances that matched no metric:",
        "    --golden-tolerance 'x'",
        "golden report written to r.json",
    ]


def test_summary_is_silent_when_no_golden_was_touched_and_sections_are_capped():
    kw = {"unused": [], "pruned": [], "unused_tolerances": [], "report_path": None}
    assert session_text.summary_lines(SessionState(), relative_to=Path("."), **kw) == []
    many = Outcome("t", "g", status=Status.RECORDED, recorded=[f"line {i}" for i in range(25)])
    lines = session_text.summary_lines(session(many), relative_to=Path("."), **kw)
    assert lines[-2:] == ["    line 19", "    ... and 5 more"]


def test_calibrated_table():
    entry = {
        "directory": "/p/golden/t",
        "rows": [
            {"metric": "pg_loss", "rel_spread": 1.234e-6, "abs_spread": 5e-7, "at_step": 2,
             "rtol": 1.2e-5, "atol": 5.5e-6},
            {"metric": "kl", "rel_spread": 0.0, "abs_spread": 0.0, "at_step": None},
        ],
        "skipped": "",
    }  # fmt: skip
    assert session_text.calibrated_table(entry, "golden/t") == [
        "calibrated tolerances written to golden/t/tolerances.json:",
        "    metric   rel spread  abs spread  at step  rtol          atol",
        "    pg_loss  1.23e-06    5e-07       2        1.2e-05       5.5e-06",
        "    kl       0           0           -        default kept  -",
    ]
    empty = {"rows": [], "skipped": "every run raised"}
    assert session_text.calibrated_table(empty, "golden/t") == [
        "not calibrated: golden/t (every run raised)"
    ]


def test_json_report_from_hand_built_outcomes_is_strict_json():
    state = update_example()
    doc = session_text.report_document(state, mode="update", unused=[Path("g/old")], pruned=[])
    json.dumps(doc, allow_nan=False)
    assert doc["format"] == "pytest-rollout-golden-report" and doc["mode"] == "update"
    assert doc["summary"] == {"replayed": 0, "recorded": 1, "updated": 1, "failed": 1, "xfailed": 1}
    assert [t["status"] for t in doc["tests"]] == ["updated", "recorded", "failed", "xfailed"]
    assert "comparisons" not in doc["tests"][0] and doc["tests"][2]["discarded"] is True
    ent = next(c for c in doc["comparisons"] if c["metric"] == "ent")
    assert (ent["test"], ent["golden"]) == (
        "test_it.py::test_train",
        "/p/golden/test_it/test_train",
    )
    assert (ent["expected"], ent["actual"], ent["abs_diff"], ent["verdict"]) == (
        1.0,
        "nan",
        "nan",
        "updated",
    )
    assert len(doc["comparisons"]) == 8 and doc["unused"] == ["g/old"]


def test_the_report_survives_the_xdist_round_trip():
    """Workers send their state as JSON: the controller's report is the same text."""
    state = update_example()
    merged = SessionState()
    merged.merge_json(state.to_json())
    assert all(isinstance(o, Outcome) for o in merged.outcomes)
    kw = {"mode": "auto", "unused": [], "pruned": []}
    assert json.dumps(session_text.report_document(merged, **kw)) == json.dumps(
        session_text.report_document(state, **kw)
    )
    summary = {"unused": [], "pruned": [], "unused_tolerances": [], "report_path": None}
    assert session_text.summary_lines(
        merged, relative_to=Path("."), **summary
    ) == session_text.summary_lines(state, relative_to=Path("."), **summary)


def test_cli_rows():
    assert tables.verify_row("ok", Path("golden/t"), " (3 files)") == "ok   golden/t (3 files)"
    assert tables.verify_summary(2, 1, 0) == (
        "2 goldens checked, 1 with problems, 0 could not be checked"
    )
    assert tables.metric_cell(None) == "-"
    assert tables.metric_cell(0.1 + 0.2) == "0.3"  # a recorded float, to 8 digits
    assert tables.metric_cell("nan") == "nan"
    assert tables.metric_cell({"dtype": "float32", "value": 0.25}) == "0.25"
    assert tables.metric_cell({"dtype": "float32", "shape": [2], "values": [1, 2]}) == "float32[2]"
    counts = {"goldens": 1, "differ": 1, "within_tolerance": 0, "one_sided": 0}
    assert diff_text.diff_summary(counts) == (
        "1 golden compared: 1 differ beyond tolerance, 0 within tolerance, 0 on one side only"
    )


def test_golden_diff_lines_from_hand_built_rows():
    from pytest_rollout_golden._internal.results import GoldenDiff, Row

    allowed = {"allowed": "rtol=1e-05, atol=1e-08", "source": "built-in default"}
    d = GoldenDiff("t", "a/t", "b/t")
    d.rows = [
        Row("metric", "pg_loss", 0, True, expected=0.5, actual=0.5, **allowed),
        Row("metric", "pg_loss", 1, False, expected=0.5, actual=0.5005, abs_max=5e-4,
            rel_max=1e-3, detail="beyond", **allowed),
        Row("tensor", "actor/lp", 1, False, rank=0, shape=([2], [2]),
            dtype=("float32", "float32"), numel=2, mismatched=1, abs_max=0.5, abs_mean=0.25,
            rel_max=0.25, rel_mean=0.125, detail="line 1\nline 2", **allowed),
        Row("tensor", "actor/ent", 1, True, **allowed),
        Row("metric", "clip", 0, True, compared=False, source="--ignore"),
    ]  # fmt: skip
    assert diff_text.golden_diff_lines(d) == [
        "t: DIFFERS (2 beyond tolerance); 3 metric values, 2 tensors compared",
        "  metric   first divergence  steps beyond  max abs diff  max rel diff  allowed",
        "  pg_loss  step 1            1/2           0.0005        0.001         "
        "rtol=1e-05, atol=1e-08 (built-in default)",
        "  clip     -                 0/1           -             -             "
        "not compared (--ignore)",
        "  metric values beyond tolerance:",
        "    metric   step  A    B       abs diff  rel diff",
        "    pg_loss  1     0.5  0.5005  0.0005    0.001     beyond",
        "  tensors beyond tolerance:",
        "    tensor    step  rank  micro  A           B           mismatched  max abs  mean abs  "
        "max rel  mean rel  first divergence  allowed",
        "    actor/lp  1     0     -      float32[2]  float32[2]  1/2         0.5      0.25      "
        "0.25     0.125     step 1            rtol=1e-05, atol=1e-08 (built-in default)",
        "    actor/lp (step 1):",
        "      line 1",
        "      line 2",
        "  1 of 2 tensors within tolerance",
        "  not compared (excluded on purpose): clip",
    ]
    one_sided = GoldenDiff("u", "a/u", None, problems=["only in A"])
    assert diff_text.golden_diff_lines(one_sided) == ["u: DIFFERS: only in A"]


def test_why_a_value_has_no_recording_names_what_the_golden_holds():
    remedy = "run it"
    assert messages.never_recorded_metric("2", None, remedy) == "no golden exists yet; run it"
    assert messages.never_recorded_metric("2", {"0": {}, "1": {}}, remedy) == (
        "step 2 was never recorded (recorded steps: [0, 1]); run it"
    )
    assert messages.never_recorded_metric("1", {"1": {}}, remedy) == (
        "never recorded at step 1; run it"
    )
    assert messages.never_recorded_tensors("fwd", 3, None, remedy) == (
        "never recorded in this file; run it"
    )
    assert messages.never_recorded_tensors("fwd", 3, [0, 1], remedy) == (
        "step 3 was never recorded (recorded steps: [0, 1]); run it"
    )
    assert messages.never_recorded_tensors("fwd", 3, [], remedy) == (
        "step 3 was never recorded (no 'fwd' tensors were recorded); run it"
    )


def test_a_missing_rollout_step_says_why_it_cannot_be_recorded(tmp_path):
    message = messages.missing_input("rollout 'r'", 4, [2, 0, 2], tmp_path / "g", "do X")
    assert message.endswith(
        "(recorded steps: [0, 2]). Recording is off (--golden-strict or CI); do X."
    )
    assert message.startswith("rollout 'r' at step 4 is not in the golden ")
    replay_only = messages.missing_input("r", 1, [], tmp_path, "do Y", recorder="t::ref")
    assert "(nothing of it was recorded). This test only replays the golden of t::ref" in (
        replay_only
    )


def test_counts_of_one_are_singular_in_every_summary():
    assert tables.verify_summary(1, 1, 1) == (
        "1 golden checked, 1 with problems, 1 could not be checked"
    )
    assert tables.verify_totals(1, 1, 0, 0).startswith("1 golden and 1 lane checked")
    one = [Comparison("pg_loss", 0, Verdict.NEW)]
    assert messages.recorded_lines({}, True, {}, one) == ["1 metric: step 0"]
    from pytest_rollout_golden._internal.results import GoldenDiff, Row

    d = GoldenDiff("t", "a/t", "b/t")
    d.rows = [Row("metric", "pg_loss", 0, True), Row("tensor", "lp", 0, True)]
    assert diff_text.golden_diff_lines(d)[0] == "t: ok; 1 metric value, 1 tensor compared"
    assert wording.plural(1, "file") == "1 file"
    assert wording.plural(0, "file") == "0 files"
    assert wording.plural(2, "entry", "entries") == "2 entries"
    assert diff_text.golden_diff_lines(d)[-1] == "  1 of 1 tensor within tolerance"


def test_a_nan_failure_is_beyond_by_nan_with_no_rounding_level_note():
    """NaN against NaN (equal_nan off) has no distance and its recorded 'magnitude' is no
    magnitude: the row says NaN, not inf, and no note calls it a cancelled value."""
    nan = float("nan")
    tolerance = Tolerance(rtol=1e-4, atol=5e-7, scale="recorded")
    failed = Comparison(
        "kl", 0, Verdict.FAIL, expected=nan, actual=nan, abs_diff=0.0, rel_diff=0.0,
        tolerance=tolerance, excess=math.inf, scale=0.0,
    )  # fmt: skip
    assert messages.beyond(failed) == "NaN"
    assert messages.first_divergence([failed]).startswith("first divergence at step 0: kl NaN")
    assert messages.cancelled_notes([failed]) == []
    tiny = Comparison(
        "loss", 0, Verdict.FAIL, expected=1e-9, actual=2e-9, tolerance=tolerance,
        excess=3.0, scale=1e-9,
    )  # fmt: skip
    assert messages.beyond(tiny) == "3x" and len(messages.cancelled_notes([tiny])) == 1


def test_a_trend_failure_reads_as_a_trend_not_as_the_first_divergence():
    """A trend is measured over the whole run: the headline names it apart from the step
    where values first diverged, and the update remedy stays for the values alone."""
    drift = Comparison("pg_loss", 3, Verdict.FAIL, expected=0.5, actual=0.6, excess=4.0)
    grown = Comparison(
        "kl growth", 29, Verdict.FAIL, kind=messages.TREND_KIND, actual=3.1, bound=2.0,
        excess=1.55, detail="trend beyond its bound over steps 0-29: ...\n    mean 1 -> 3.1",
    )  # fmt: skip
    message = messages.mismatch_message(outcome(drift, grown), [drift, grown]).splitlines()
    assert message[0].startswith(
        "golden mismatch: first divergence at step 3: pg_loss 4x beyond tolerance; "
        "trend beyond its bound: kl growth 3.1 > 2; 2 of 2 checks failed"
    )
    assert message[3:] == [
        "trend beyond its bound over steps 0-29: ...",
        "    mean 1 -> 3.1",
        messages.TREND_REMEDY,
        messages.IF_RIGHT,
    ]
    alone = messages.mismatch_message(outcome(grown), [grown])
    assert alone.endswith(messages.TREND_REMEDY) and "first divergence" not in alone
    document = grown.to_json()
    assert document["bound"] == 2.0 and Comparison.from_json(document) == grown
    assert "bound" not in drift.to_json() and Comparison.from_json(drift.to_json()) == drift


def test_a_zero_dim_tensor_reads_as_its_value_in_a_table():
    import torch

    from pytest_rollout_golden._internal.golden.checks import summary
    from pytest_rollout_golden._internal.wording import number

    assert number(summary(torch.tensor(4.0))) == "4.0"
    assert number(summary(torch.tensor(float("inf")))) == "inf"
    assert number(summary(torch.zeros(2, 3))) == "float32[2, 3]"
