"""Direct tests of the session options, the marker options and the prune decisions.

These are the plugin's decisions without pytest in between; test_plugin_*.py and
test_golden_prune_nesting_links.py check that pytest shows them as usage errors and notes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_rollout_golden import markers, options, prune
from pytest_rollout_golden.options import OptionError
from pytest_rollout_golden.results import Mode
from pytest_rollout_golden.session import SessionState


@pytest.mark.parametrize(
    ("update", "strict", "calibrate", "ci", "mode"),
    [
        (False, False, None, False, Mode.AUTO),
        (True, False, None, False, Mode.UPDATE),
        (True, False, None, True, Mode.UPDATE),  # --update-golden overrides CI
        (False, True, None, False, Mode.STRICT),
        (False, False, None, True, Mode.STRICT),
        (False, False, 3, False, Mode.STRICT),  # calibration measures, never records
    ],
)
def test_session_mode(update, strict, calibrate, ci, mode):
    assert options.session_mode(update=update, strict=strict, calibrate=calibrate, ci=ci) is mode


@pytest.mark.parametrize(
    ("update", "strict", "calibrate", "message"),
    [
        (True, True, None, "--update-golden and --golden-strict exclude each other"),
        (False, False, 1, "needs N >= 2 runs"),
        (False, False, 0, "needs N >= 2 runs"),
        (True, False, 2, "record them first, without --update-golden"),
    ],
)
def test_flags_that_exclude_each_other(update, strict, calibrate, message):
    with pytest.raises(OptionError, match=message):
        options.session_mode(update=update, strict=strict, calibrate=calibrate, ci=False)


@pytest.mark.parametrize("value", ["0", 7, "4294967295"])
def test_good_seeds(value):
    assert options.parse_seed(value, "ini golden_seed") == int(value)


@pytest.mark.parametrize("value", ["-1", 2**32, 1.5, True, None, "abc"])
def test_bad_seeds_name_their_source(value):
    with pytest.raises(OptionError, match=r"^ini golden_seed must be an integer in \[0, 2\*\*32\)"):
        options.parse_seed(value, "ini golden_seed")


@pytest.mark.parametrize(
    ("marker", "flag", "ini", "expected"),
    [
        (None, None, "", (None, "marker missing_step=")),
        ("repeat", "error", "generate", ("repeat", "marker missing_step=")),
        (None, "error", "generate", ("error", "--golden-missing-step=")),
        (None, None, " generate ", ("generate", "ini golden_missing_step=")),
    ],
)
def test_missing_step_policy_marker_then_flag_then_ini(marker, flag, ini, expected):
    assert options.missing_step_policy(marker, flag, ini, where="t.py::t") == expected


def test_an_unknown_missing_step_policy_names_the_test_and_the_source():
    with pytest.raises(OptionError, match=r"^t\.py::t: ini golden_missing_step= must be one of"):
        options.missing_step_policy(None, None, "skip", where="t.py::t")


def test_golden_root_must_not_contain_the_project(tmp_path):
    assert options.golden_root(tmp_path, "golden") == tmp_path / "golden"
    for bad in (".", "..", ""):
        with pytest.raises(OptionError, match="golden_dir"):
            options.golden_root(tmp_path, bad)


def test_report_path_is_checked_before_any_test(tmp_path):
    assert options.report_path(None) is None
    assert options.report_path(str(tmp_path / "new" / "r.json")) == tmp_path / "new" / "r.json"
    with pytest.raises(OptionError, match="is a directory; name a file"):
        options.report_path(str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(OptionError, match="is not a directory"):
        options.report_path(str(tmp_path / "file" / "r.json"))


def test_truthy_env(monkeypatch):
    for value, truthy in [("", False), ("0", False), ("false", False), (" Off ", False)]:
        monkeypatch.setenv("X_TRUTHY", value)
        assert options.truthy_env("X_TRUTHY") is truthy
    monkeypatch.setenv("X_TRUTHY", "true")
    assert options.truthy_env("X_TRUTHY")
    monkeypatch.delenv("X_TRUTHY")
    assert not options.truthy_env("X_TRUTHY")


# ---------------------------------------------------------------------- marker options


def test_the_closest_marker_wins():
    found = [((), {"key": "fn", "exact": True}), ((), {"key": "cls", "seed": 3})]
    assert markers.marker_options(found, "t") == {"key": "fn", "seed": 3, "exact": True}


@pytest.mark.parametrize(
    ("found", "message"),
    [
        ([(("x",), {})], "takes keywords only"),
        ([((), {"tolerance": {}})], r"unknown @pytest.mark.golden option\(s\) \['tolerance'\]"),
        ([((), {"key": "a", "shared": "b"})], "key= and shared= exclude each other"),
    ],
)
def test_marker_mistakes_name_the_test(found, message):
    with pytest.raises(OptionError, match=rf"^t\.py::t: .*{message}"):
        markers.marker_options(found, "t.py::t")


def test_a_layout_variant_replays_its_reference():
    variant = {"variant": "tp2", "reference": "tp1"}
    assert markers.replays_reference(variant)
    assert not markers.replays_reference({"variant": "tp1", "reference": "tp1"})
    assert not markers.replays_reference({"variant": "tp2"})
    assert markers.reference_name("t", "test_x[tp2-fp32]", variant) == "test_x[tp1-fp32]"
    with pytest.raises(OptionError, match="'tp2' is not in the test id"):
        markers.reference_name("t", "test_x[dp2]", variant)
    recipe = markers.reference_recipe({**variant, "shared": "pol"})
    assert recipe.recorder == "the reference layout [tp1] (shared golden 'pol')"
    assert 'pytest --update-golden -k "tp1"' in recipe.remedy


# ---------------------------------------------------------------------- pruning


def _golden(directory: Path) -> Path:
    from pytest_rollout_golden.golden_files import GoldenFiles

    files = GoldenFiles(directory)
    files.open()
    files.commit({"test": "t", "fingerprint": {}}, metrics={"0": {"x": 1.0}}, keep=bool)
    files.close()
    return directory


def test_prune_deletes_goldens_of_gone_files_and_empty_folders(tmp_path):
    root = tmp_path / "golden"
    gone_file = _golden(root / "test_gone" / "test_a")
    kept_file = _golden(root / "test_here" / "test_b")
    shared = _golden(root / "@shared" / "pol")
    goldens = [(gone_file, None), (kept_file, tmp_path / "test_here.py"), (shared, None)]
    assert prune.gone(root, gone_file, None)
    assert not prune.gone(root, shared, None)  # a shared golden has no test file of its own
    result = prune.prune(root, goldens, tests=False)
    assert result.deleted == [gone_file]
    assert not (root / "test_gone").exists()
    assert kept_file.is_dir() and shared.is_dir()
    assert "kept 2 unused golden(s) of test files that still exist" in result.notes[0]
    result = prune.prune(root, goldens[1:], tests=True)
    assert result.deleted == [kept_file, shared] and result.notes == []


def test_prune_keeps_files_it_does_not_own_and_refuses_a_partial_run(tmp_path):
    root = tmp_path / "golden"
    golden = _golden(root / "test_gone" / "test_a")
    (golden / "notes.txt").write_text("mine")
    result = prune.prune(root, [(golden, None)], tests=False)
    assert result.deleted == [] and "notes.txt" in result.notes[0]
    assert [p.name for p in golden.iterdir()] == ["notes.txt"]  # only the golden's own files
    other = _golden(root / "test_other" / "test_b")
    result = prune.prune(root, [(other, None)], tests=True, refused="tests failed")
    assert result.notes == ["--golden-prune skipped: tests failed; nothing was deleted"]
    assert json.loads((other / "manifest.json").read_text())["test"] == "t"


def test_not_full_run(tmp_path):
    state = SessionState()
    assert prune.not_full_run(state, tmp_path, stopped=False, failed=False) == ""
    assert prune.not_full_run(state, tmp_path, stopped=True, failed=True) == (
        "the session stopped early"
    )
    assert prune.not_full_run(state, tmp_path, stopped=False, failed=True) == "tests failed"
    state.partial_files |= {str(tmp_path / "a.py"), str(tmp_path / "b.py")}
    why = prune.not_full_run(state, tmp_path, stopped=True, failed=True)
    assert why.startswith("some tests were deselected") and "(a.py and 1 more)" in why
