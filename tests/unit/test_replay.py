"""Direct tests of Golden's parts: the mode policy (a pure decision table) and the golden files.

End-to-end behaviour (record -> replay -> perturb -> fail -> update) is tested through
pytester in the test_plugin_*.py files; these pin each decision and each file operation
on its own, without pytest in between.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from pytest_rollout_golden import store
from pytest_rollout_golden._internal.golden.golden import Golden, SessionLinks
from pytest_rollout_golden._internal.golden.golden_files import (
    GoldenFiles,
    load_golden,
    merge_metrics,
)
from pytest_rollout_golden._internal.golden.modes import (
    ERROR,
    GENERATE,
    KEEP,
    RECORD,
    REFUSE,
    REGENERATE,
    REPEAT,
    REPLAY,
    ModePolicy,
)
from pytest_rollout_golden._internal.results import Mode, Status, Verdict
from pytest_rollout_golden.errors import GoldenError, GoldenFormatError, GoldenMismatch

AUTO, UPDATE, STRICT = Mode.AUTO, Mode.UPDATE, Mode.STRICT

# ---------------------------------------------------------------------- the mode policy


@pytest.mark.parametrize(
    ("mode", "records", "rerecords", "replays", "fresh_existing", "replaces_damaged"),
    [
        (AUTO, True, False, True, False, False),
        (UPDATE, True, True, False, True, True),
        (STRICT, False, False, True, False, False),
    ],
)
def test_what_each_mode_may_do_with_an_existing_golden(
    mode, records, rerecords, replays, fresh_existing, replaces_damaged
):
    policy = ModePolicy.of(mode)
    assert policy.records is records
    assert policy.rerecords is rerecords
    assert policy.replays(True) is replays
    assert policy.replays(False) is False  # nothing to replay without a golden
    assert policy.fresh(True) is fresh_existing
    assert policy.fresh(False) is True  # a first recording is always a whole new one
    assert policy.replaces_damaged is replaces_damaged


@pytest.mark.parametrize(
    ("mode", "ok", "ignore", "verdict"),
    [
        (AUTO, True, False, Verdict.PASS),
        (AUTO, False, False, Verdict.FAIL),
        (STRICT, True, False, Verdict.PASS),
        (STRICT, False, False, Verdict.FAIL),
        (UPDATE, True, False, Verdict.UPDATED),
        (UPDATE, False, False, Verdict.UPDATED),  # the new value is the reference now
        (AUTO, False, True, Verdict.IGNORED),
        (STRICT, False, True, Verdict.IGNORED),
        (UPDATE, True, True, Verdict.IGNORED),
    ],
)
def test_verdict_on_a_recorded_value(mode, ok, ignore, verdict):
    assert ModePolicy.of(mode).verdict(ok=ok, ignore=ignore) == verdict


@pytest.mark.parametrize(
    ("mode", "unrecorded", "reports_unchecked"),
    [(AUTO, Verdict.NEW, True), (UPDATE, Verdict.NEW, False), (STRICT, Verdict.MISSING, True)],
)
def test_a_value_missing_from_the_golden_or_from_the_run(mode, unrecorded, reports_unchecked):
    policy = ModePolicy.of(mode)
    assert policy.unrecorded == unrecorded
    assert policy.reports_unchecked is reports_unchecked


@pytest.mark.parametrize(
    ("mode", "recorded", "warns"),
    [
        (AUTO, False, True),  # about to be recorded
        (AUTO, True, False),  # compared against the recording, which fails on NaN itself
        (UPDATE, True, True),  # re-recorded
        (UPDATE, False, True),
        (STRICT, False, False),  # never written
        (STRICT, True, False),
    ],
)
def test_nan_warning_only_when_the_value_is_written(mode, recorded, warns):
    assert ModePolicy.of(mode).warns_nan(recorded=recorded) is warns


@pytest.mark.parametrize(
    ("mode", "regenerate", "action"),
    [
        (AUTO, False, REPLAY),
        (AUTO, True, REPLAY),  # regenerate only acts under --update-golden
        (STRICT, False, REPLAY),
        (UPDATE, False, KEEP),  # a recorded rollout is the test's input: kept
        (UPDATE, True, REGENERATE),
    ],
)
def test_a_recorded_rollout(mode, regenerate, action):
    assert ModePolicy.of(mode, regenerate=regenerate).recorded_rollout() == action


@pytest.mark.parametrize(
    ("mode", "missing_step", "steps_recorded", "action"),
    [
        # no other step recorded: nothing could stand in, so record unless recording is off
        (AUTO, None, False, RECORD),
        (AUTO, REPEAT, False, RECORD),
        (AUTO, ERROR, False, RECORD),
        (UPDATE, GENERATE, False, RECORD),
        (STRICT, None, False, REFUSE),
        (STRICT, REPEAT, False, REFUSE),
        # other steps recorded: the policy decides
        (AUTO, None, True, RECORD),
        (AUTO, RECORD, True, RECORD),
        (AUTO, ERROR, True, ERROR),
        (AUTO, REPEAT, True, REPEAT),
        (AUTO, GENERATE, True, GENERATE),
        (UPDATE, None, True, RECORD),
        (UPDATE, ERROR, True, RECORD),  # --update-golden is the remedy of error
        (UPDATE, REPEAT, True, REPEAT),
        (UPDATE, GENERATE, True, GENERATE),
        (STRICT, None, True, REFUSE),  # strict defaults to error, and never records
        (STRICT, RECORD, True, REFUSE),
        (STRICT, ERROR, True, REFUSE),
        (STRICT, REPEAT, True, REPEAT),  # replays a recorded step: allowed
        (STRICT, GENERATE, True, GENERATE),  # generates without recording: allowed
    ],
)
def test_a_rollout_step_never_recorded(mode, missing_step, steps_recorded, action):
    policy = ModePolicy.of(mode, missing_step=missing_step)
    assert policy.missing_rollout_step(steps_recorded=steps_recorded) == action


def test_an_unknown_missing_step_policy_is_refused_naming_its_source():
    with pytest.raises(ValueError, match=r"--golden-missing-step=: .*got 'skip'"):
        ModePolicy.of(AUTO, missing_step="skip", missing_step_source="--golden-missing-step=")


@pytest.mark.parametrize("mode", list(Mode))
def test_a_replay_only_golden_never_records(mode):
    policy = ModePolicy.of(mode, replay_only=True)
    assert policy.mode is STRICT and not policy.records
    assert policy.refuses_missing_golden(False)
    assert not policy.refuses_missing_golden(True)
    assert not ModePolicy.of(mode).refuses_missing_golden(False)  # others record it


@pytest.mark.parametrize(
    ("mode", "exists", "updated", "after"),
    [
        (UPDATE, True, True, AUTO),  # another test re-recorded this shared golden: replay it
        (UPDATE, True, False, UPDATE),
        (UPDATE, False, True, UPDATE),  # nothing to replay
        (AUTO, True, True, AUTO),
        (STRICT, True, True, STRICT),
    ],
)
def test_a_golden_already_updated_this_session_is_a_new_policy(mode, exists, updated, after):
    policy = ModePolicy.of(mode, regenerate=True, missing_step=REPEAT)
    opened = policy.opened(exists=exists, updated_this_session=updated)
    assert opened.mode is after
    assert policy.mode is mode  # a decision, not a mutation
    assert (opened.regenerate, opened.missing_step) == (True, REPEAT)


@pytest.mark.parametrize(
    ("mode", "used", "calibrated", "kept"),
    [
        (AUTO, False, False, True),
        (STRICT, False, False, True),
        (UPDATE, True, False, True),
        (UPDATE, False, False, False),  # an update drops what the test no longer uses
        (UPDATE, False, True, True),  # calibrated tolerances describe the setup's noise
    ],
)
def test_which_old_files_a_commit_keeps(mode, used, calibrated, kept):
    assert ModePolicy.of(mode).keeps_file(used=used, calibrated=calibrated) is kept


@pytest.mark.parametrize(
    ("mode", "staged", "checked", "new", "writes"),
    [
        (AUTO, True, False, False, True),
        (AUTO, False, True, False, False),  # a pure replay writes nothing
        (AUTO, False, True, True, True),
        (STRICT, False, True, False, False),
        (UPDATE, False, True, False, True),  # every checked metric is re-recorded
        (UPDATE, False, False, False, False),
    ],
)
def test_when_finishing_commits(mode, staged, checked, new, writes):
    policy = ModePolicy.of(mode)
    assert policy.needs_write(staged=staged, checked_metrics=checked, new_values=new) is writes


@pytest.mark.parametrize(
    ("mode", "exists", "wrote", "touched", "status"),
    [
        (AUTO, False, True, True, Status.RECORDED),
        (AUTO, True, True, True, Status.RECORDED),  # new metrics added to a golden
        (UPDATE, True, True, True, Status.UPDATED),
        (UPDATE, False, True, True, Status.RECORDED),
        (AUTO, True, False, True, Status.REPLAYED),
        (STRICT, True, False, True, Status.REPLAYED),
        (AUTO, True, False, False, None),  # the test never used its golden
    ],
)
def test_final_status(mode, exists, wrote, touched, status):
    assert ModePolicy.of(mode).status(exists=exists, wrote=wrote, touched=touched) == status


# ---------------------------------------------------------------------- the golden files


def _record(directory, *, metrics=None, batches=None, keep=lambda f: True):
    files = GoldenFiles(directory)
    files.open()
    for filename, batch in (batches or {}).items():
        files.stage_batch(filename, batch, kind="rollout", name="rollout", step=0)
    written = files.commit({"test": "t", "fingerprint": {}}, metrics=metrics or {}, keep=keep)
    files.close()
    return written


def _node(value):
    return {"dtype": "float64", "value": value}


def test_commit_then_load_round_trips_every_file(tmp_path):
    directory = tmp_path / "g"
    batch = {"tokens": torch.arange(6).reshape(2, 3)}
    written = _record(
        directory,
        metrics={"1": {"kl": 0.5}, "0": {"pg_loss": 1.5}},
        batches={"rollout-a-step000000.safetensors": batch},
    )
    assert set(written) == {"rollout-a-step000000.safetensors", "metrics.json"}
    document = json.loads((directory / "metrics.json").read_text())
    assert list(document["steps"]) == ["0", "1"]  # ordered by step
    manifest, content = load_golden(directory)
    assert manifest["test"] == "t"
    assert torch.equal(content["rollout-a-step000000.safetensors"]["tokens"], batch["tokens"])
    files = GoldenFiles(directory)
    files.open()
    try:
        assert files.exists
        assert files.metrics() == {"0": {"pg_loss": 1.5}, "1": {"kl": 0.5}}
        assert files.steps("rollout", "rollout") == [0]
        assert files.steps("rollout", "other") == []
        assert files.steps("tensors", "rollout") == []
    finally:
        files.close()
    assert not files.is_open


def _changed_metrics(directory):
    """A golden whose metrics.json was edited after recording (its checksum no longer holds)."""
    _record(directory, metrics={"0": {"kl": 0.5}})
    path = directory / "metrics.json"
    path.write_text(path.read_text().replace("0.5", "0.25"))
    return directory


def test_a_file_changed_after_recording_is_refused_naming_it(tmp_path):
    directory = _changed_metrics(tmp_path / "g")
    files = GoldenFiles(directory)
    files.open()
    try:
        with pytest.raises(GoldenFormatError, match=r"metrics\.json: is corrupted .*update-golden"):
            files.metrics()
    finally:
        files.close()
    with pytest.raises(GoldenFormatError, match="checksum differs"):
        load_golden(directory)


def test_a_listed_file_that_is_gone_names_the_file_and_two_remedies(tmp_path):
    directory = tmp_path / "g"
    _record(directory, batches={"rollout-a-step000000.safetensors": {"x": torch.ones(2)}})
    (directory / "rollout-a-step000000.safetensors").unlink()
    with pytest.raises(GoldenFormatError) as caught:
        load_golden(directory)
    message = str(caught.value)
    assert "rollout-a-step000000.safetensors: listed in manifest.json but missing" in message
    assert "restore it from version control" in message and "--update-golden" in message


def test_a_metrics_file_of_another_shape_is_refused_though_its_checksum_holds(tmp_path):
    directory = tmp_path / "g"
    tx = store.Transaction(directory)
    tx.write_json("metrics.json", {"steps": {"x": {}}}, kind="metrics")
    tx.commit({"test": "t", "fingerprint": {}})
    with pytest.raises(GoldenFormatError, match="step key 'x' that is not an integer"):
        load_golden(directory)


def test_not_a_golden_directory(tmp_path):
    with pytest.raises(GoldenError, match=r"no manifest\.json; not a golden directory"):
        load_golden(tmp_path)
    files = GoldenFiles(tmp_path / "new")
    files.open()
    try:
        assert not files.exists and files.recorded == {} and files.metrics() == {}
    finally:
        files.close()


def test_a_damaged_manifest_raises_unless_it_counts_as_missing(tmp_path):
    directory = tmp_path / "g"
    _record(directory, metrics={"0": {"kl": 0.5}})
    (directory / "manifest.json").write_text("{not json")
    files = GoldenFiles(directory)
    with pytest.raises(GoldenFormatError, match=r"manifest\.json"):
        files.open()
    assert files.is_open  # locked before reading: the caller's close() releases it
    files.close()
    files = GoldenFiles(directory)
    files.open(damaged_is_missing=True)
    try:
        assert not files.exists
    finally:
        files.close()


def test_abort_leaves_the_recorded_version_untouched(tmp_path):
    directory = tmp_path / "g"
    _record(directory, metrics={"0": {"kl": 0.5}})
    before = sorted(os.listdir(directory))
    files = GoldenFiles(directory)
    files.open()
    assert files.abort() is False  # nothing staged yet
    files.stage_batch("rollout-a-step000001.safetensors", {"x": torch.ones(1)})
    assert files.staged("rollout-a-step000001.safetensors")
    assert files.staged_path("rollout-a-step000001.safetensors").is_file()
    assert files.abort() is True
    files.close()
    assert sorted(os.listdir(directory)) == before
    assert [p.name for p in tmp_path.iterdir()] == ["g"]  # no staging directory left behind


def test_commit_keeps_only_the_old_files_keep_accepts(tmp_path):
    directory = tmp_path / "g"
    old = {
        "rollout-a-step000000.safetensors": {"x": torch.ones(1)},
        "rollout-a-step000001.safetensors": {"x": torch.zeros(1)},
    }
    _record(directory, batches=old, metrics={"0": {"kl": 0.5}})
    written = _record(
        directory,
        metrics={"0": {"kl": 0.25}},
        keep=lambda filename: filename.endswith("step000001.safetensors"),
    )
    assert set(written) == {"rollout-a-step000001.safetensors", "metrics.json"}
    assert set(os.listdir(directory)) == {*written, "manifest.json"}
    assert load_golden(directory)[1]["metrics.json"] == {"steps": {"0": {"kl": 0.25}}}


def test_merge_metrics_adds_new_values_and_an_update_replaces_them():
    recorded = {"0": {"kl": _node(0.5), "pg_loss": _node(1.0)}, "1": {"kl": _node(0.4)}}
    checked = {"0": {"kl": _node(0.9), "entropy": _node(2.0)}, "2": {"kl": _node(0.3)}}
    added = merge_metrics(recorded, checked, replace=False)
    assert added == {
        "0": {"kl": _node(0.5), "pg_loss": _node(1.0), "entropy": _node(2.0)},
        "1": {"kl": _node(0.4)},
        "2": {"kl": _node(0.3)},
    }
    assert merge_metrics(recorded, checked, replace=True) == checked
    assert recorded["0"] == {"kl": _node(0.5), "pg_loss": _node(1.0)}  # inputs untouched


# ---------------------------------------------------------------------- Golden over both


class _Registry:
    def __init__(self):
        self.updated = set()

    def contains(self, directory):
        return directory in self.updated

    def add(self, directory):
        self.updated.add(directory)


def test_a_golden_updated_earlier_this_session_is_replayed_not_rerecorded(tmp_path):
    registry, directory = _Registry(), tmp_path / "g"
    with Golden(directory) as golden:
        golden.check({"kl": 0.5})
    first = Golden(directory, mode=UPDATE, session=SessionLinks(registry=registry))
    first.check({"kl": 0.25})
    assert first.finish().status == Status.UPDATED
    assert registry.updated == {directory}
    links = SessionLinks(registry=registry)  # e.g. a second test, same key
    second = Golden(directory, mode=UPDATE, session=links)
    second.check({"kl": 0.125})
    assert second.mode is AUTO
    with pytest.raises(GoldenMismatch, match="kl"):
        second.finish()
    assert load_golden(directory)[1]["metrics.json"]["steps"]["0"]["kl"] == 0.25


# ---------------------------------------------------------------------- damaged files


def _with_tolerances(directory, document):
    """A golden with metrics and a ``tolerances.json`` holding ``document``."""
    _record(directory, metrics={"0": {"kl": 0.5}})
    tx = store.Transaction(directory)
    tx.keep(
        "metrics.json",
        json.loads((directory / "manifest.json").read_text())["files"]["metrics.json"],
    )
    tx.write_json("tolerances.json", document, kind="tolerances")
    tx.commit({"test": "t", "fingerprint": {"torch": "0"}})


_CALIBRATED = {
    "format": "pytest-rollout-golden-tolerances",
    "tolerances": {"kl": {"rtol": 1e-3, "atol": 0.0}},
    "layout_tolerances": {"kl": {"rtol": 1e-2, "atol": 0.0}},
}


def test_load_with_a_damaged_fallback_returns_it_only_while_re_recording(tmp_path):
    directory = _changed_metrics(tmp_path / "g")
    files = GoldenFiles(directory)
    files.open()
    try:
        with pytest.raises(GoldenFormatError, match="is corrupted"):
            files.load("metrics.json", damaged={})  # not re-recording: the error stands
        assert files.damaged == set()
    finally:
        files.close()
    files = GoldenFiles(directory)
    files.open(damaged_is_missing=True)
    try:
        assert files.replaces_damaged
        assert files.load("metrics.json", damaged="fallback") == "fallback"
        assert files.metrics() == {}
        assert files.damaged == {"metrics.json"}
        with pytest.raises(GoldenFormatError):
            files.load("metrics.json")  # without a fallback it always raises
    finally:
        files.close()


def test_commit_drops_a_damaged_file_even_if_keep_accepts_it(tmp_path):
    directory = tmp_path / "g"
    _with_tolerances(directory, {"format": "something else"})

    files = GoldenFiles(directory)
    files.open(damaged_is_missing=True)
    try:
        assert files.calibrated_layers() == (None, None)
        assert files.damaged == {"tolerances.json"}
        written = files.commit(files.new_manifest("t", fresh=False), metrics={}, keep=bool)
    finally:
        files.close()
    assert set(written) == set()  # metrics.json is written only from metrics=
    assert not (directory / "tolerances.json").exists()


def test_recorded_layers_of_a_golden(tmp_path):
    from pytest_rollout_golden._internal.tolerance.calibration import LAYOUT_SOURCE, SOURCE

    plain, calibrated = tmp_path / "plain", tmp_path / "calibrated"
    _record(plain, metrics={"0": {"kl": 0.5}})
    _with_tolerances(calibrated, _CALIBRATED)
    for directory, layout_variant, sources in [
        (plain, True, (None, None)),
        (calibrated, False, (SOURCE, None)),
        (calibrated, True, (SOURCE, LAYOUT_SOURCE)),
    ]:
        files = GoldenFiles(directory)
        files.open()
        try:
            layers = files.calibrated_layers(layout_variant=layout_variant)
        finally:
            files.close()
        assert tuple(None if x is None else x.source for x in layers) == sources
    assert layers[0].entries["kl"].rtol == 1e-3 and layers[1].entries["kl"].rtol == 1e-2


def test_a_calibrated_file_of_another_format_raises_unless_re_recording(tmp_path):

    directory = tmp_path / "g"
    _with_tolerances(directory, {"format": "something else"})
    files = GoldenFiles(directory)
    files.open()
    try:
        with pytest.raises(GoldenFormatError, match="not a calibrated-tolerances file of ours"):
            files.calibrated_layers()
    finally:
        files.close()


def test_new_manifest_takes_a_fresh_fingerprint_or_keeps_the_recorded_one(tmp_path):
    directory = tmp_path / "g"
    _with_tolerances(directory, _CALIBRATED)  # recorded fingerprint {"torch": "0"}
    files = GoldenFiles(directory)
    files.open()
    try:
        assert files.new_manifest("t2", fresh=False) == {
            "test": "t2",
            "fingerprint": {"torch": "0"},
        }
        fresh = files.new_manifest("t2", fresh=True)
    finally:
        files.close()
    assert fresh["test"] == "t2" and fresh["fingerprint"]["torch"] == torch.__version__


# ---------------------------------------------------------------------- what one check adds


def test_staged_tensors_decision():
    from pytest_rollout_golden._internal.golden.checks import staged_tensors
    from pytest_rollout_golden._internal.results import Comparison

    recorded = {"a": "old a"}
    tensors = {"a": "new a", "b": "new b"}
    new = [Comparison("n/a", 0, Verdict.PASS), Comparison("n/b", 0, Verdict.NEW)]
    passed = [Comparison("n/a", 0, Verdict.PASS)]
    auto, update = ModePolicy.of(AUTO), ModePolicy.of(UPDATE)
    assert staged_tensors(recorded, {"a": "new a"}, passed, auto) is None  # nothing new
    # a new tensor: the file is rewritten, keeping the recorded values of the others
    assert staged_tensors(recorded, tensors, new, auto) == {"a": "old a", "b": "new b"}
    # an update rewrites it with this run's values, even when nothing is new
    assert staged_tensors(recorded, {"a": "new a"}, passed, update) == {"a": "new a"}


def test_checker_results_and_usage():
    from pytest_rollout_golden._internal.golden import metric_codec
    from pytest_rollout_golden._internal.golden.checks import Checker
    from pytest_rollout_golden._internal.tolerance.spec import Layer
    from pytest_rollout_golden._internal.tolerance.stack import Stack, ToleranceUsage

    layer = Layer("call", {"kl": {"rtol": 0.1, "atol": 0.0}, "unused": {"rtol": 1.0}})
    resolver = Stack().resolver().above(layer)
    usage = ToleranceUsage()
    node = metric_codec.encode(1.05, where="kl")
    old = metric_codec.encode(1.0, where="kl")

    def checker(mode):
        return Checker(resolver, ModePolicy.of(mode), usage, lambda: "never recorded here")

    assert checker(AUTO).metric("kl", 0, old, node).verdict is Verdict.PASS  # within rtol=0.1
    assert checker(UPDATE).metric("kl", 0, old, node).verdict is Verdict.UPDATED
    assert checker(AUTO).metric("kl", 0, None, node).verdict is Verdict.NEW
    missing = checker(STRICT).metric("kl", 0, None, node)
    assert (missing.verdict, missing.detail, missing.actual) == (
        Verdict.MISSING,
        "never recorded here",
        1.05,
    )
    far = checker(AUTO).metric("pg_loss", 0, old, node)  # built-in default: far too tight
    assert far.verdict is Verdict.FAIL
    assert usage.unused(layer) == ["unused"]
    old_tensor, new_tensor = torch.tensor([1.0, 5.0]), torch.tensor([1.0, 9.0])
    where = {"step": 2, "rank": 1, "micro": 0}
    masked = checker(AUTO).tensor(
        "f/x", old_tensor, new_tensor, mask=torch.tensor([1, 0]) == 1, **where
    )
    assert (masked.verdict, masked.kind, masked.rank, masked.micro) == (
        Verdict.PASS,
        "tensor",
        1,
        0,
    )
    unmasked = checker(AUTO).tensor("f/x", old_tensor, new_tensor, mask=None, **where)
    assert unmasked.verdict is Verdict.FAIL  # the second element differs, and is compared


def test_argument_checks_of_a_check():
    from pytest_rollout_golden._internal.golden import checks
    from pytest_rollout_golden.errors import UnsupportedValueError

    with pytest.raises(TypeError, match=r"needs a mapping of metric name -> value, got list"):
        checks.require_metrics([1.0])
    with pytest.raises(UnsupportedValueError, match=r"metric 3 at step 1: a metric name must be"):
        checks.encode_metric(3, 1.0, 1, {})
    with pytest.raises(ValueError, match=r"metric 'kl' at step 1 was already checked"):
        checks.encode_metric("kl", 1.0, 1, {"kl": 0.5})
    with pytest.raises(TypeError, match=r"check_tensors\('f'\) needs a non-empty mapping"):
        checks.tensor_masks("f", {}, None)
    assert checks.tensor_masks("f", {"x": torch.ones(2, 3)}, None) == {}
    masks = checks.tensor_masks("f", {"x": torch.ones(2, 3, 4)}, [[1, 0, 1], [0, 0, 1]])
    assert masks["x"].shape == (2, 3, 1) and masks["x"].dtype == torch.bool
    with pytest.raises(ValueError, match=r"already called in this test"):
        checks.require_first_call("f", True, step=0, rank=None, micro=None)
    checks.require_first_call("f", False, step=0, rank=None, micro=None)
    ignored = checks.not_compared(["a", "b"], 3, kind="metric", why="not recorded")
    assert [(c.name, c.step, c.verdict, c.tolerance_source) for c in ignored] == [
        ("a", 3, Verdict.IGNORED, "not recorded"),
        ("b", 3, Verdict.IGNORED, "not recorded"),
    ]


def test_numbers_keeps_the_scalar_numbers_of_metric_nodes():
    from pytest_rollout_golden._internal.golden.metric_codec import numbers

    steps = {
        "0": {"kl": 0.5, "flag": True, "n": 3, "f32": {"dtype": "float32", "value": 0.25}},
        "1": {"vec": {"dtype": "float32", "shape": [2], "values": [0.1, 0.2]}},
    }
    assert numbers(steps) == {
        "0": {"kl": (0.5, "float64"), "n": (3, "float64"), "f32": (0.25, "float32")}
    }


def test_a_script_gives_tolerances_as_a_mapping(tmp_path):
    directory = tmp_path / "g"
    with Golden(directory) as golden:
        golden.check({"pg_loss": 1.0})
    with Golden(directory, tolerances={"pg_*": {"rtol": 0.1}}) as golden:
        golden.check({"pg_loss": 1.05})  # 5%: inside the script's 10%
    assert "rtol from Golden(tolerances=)" in golden.outcome.comparisons[0].tolerance_source
    with pytest.raises(GoldenMismatch), Golden(directory) as golden:
        golden.check({"pg_loss": 1.05})  # beyond the built-in default
