"""Direct tests of the session options, the marker options and the prune decisions.

These are the plugin's decisions without pytest in between; test_plugin_*.py and
test_golden_prune_nesting_links.py check that pytest shows them as usage errors and notes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from pytest_rollout_golden._internal.pytest_plugin import (
    markers,
    options,
    prune,
    snapshot as rank_snapshots,
)
from pytest_rollout_golden._internal.pytest_plugin.options import OptionError
from pytest_rollout_golden._internal.pytest_plugin.session import SessionState
from pytest_rollout_golden._internal.results import Mode
from pytest_rollout_golden.store import location


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


def test_session_tolerances_put_the_flags_over_the_ini():
    stack = options.session_tolerances(
        ["kl:rtol=1e-2,atol=0"], ["ent*"], ["kl:rtol=1e-3,atol=0", "pg:rtol=1,atol=0"], []
    )
    tol, source = stack.resolver().resolve("kl")
    assert (tol.rtol, source) == (1e-2, "--golden-tolerance")
    assert stack.resolver().resolve("pg")[1] == "ini golden_tolerances"
    assert stack.resolver().resolve("entropy")[0].ignore
    with pytest.raises(ValueError, match=r"^ini golden_tolerances: bad tolerance"):
        options.session_tolerances([], [], ["kl:rtol=x"], [])


def test_plot_dir_needs_matplotlib(monkeypatch, tmp_path):
    import importlib.util

    assert options.plot_dir(None) is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert options.plot_dir(str(tmp_path)) == tmp_path
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(OptionError, match=r"^--golden-plot: plotting needs matplotlib"):
        options.plot_dir(str(tmp_path))


# ---------------------------------------------------------------------- marker options


def test_the_closest_marker_wins():
    found = [((), {"key": "fn", "exact": True}), ((), {"key": "cls", "seed": 3})]
    assert markers.marker_options(found, "t") == {"key": "fn", "seed": 3, "exact": True}


@pytest.mark.parametrize(
    ("found", "message"),
    [
        ([(("x",), {})], "takes keywords only"),
        ([((), {"tolerance": {}})], r"unknown option tolerance= \(did you mean 'tolerances'\?\)"),
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
    assert recipe.recorder == "the reference [tp1] (shared golden 'pol')"
    assert 'pytest --update-golden -k "tp1"' in recipe.remedy


def test_golden_directory_of_a_test(tmp_path):
    from pytest_rollout_golden.store.location import golden_dir, shared_golden_dir

    root, test_file = tmp_path / "golden", tmp_path / "tests" / "test_a.py"

    def directory(name, **options):
        return markers.golden_directory(root, tmp_path, test_file, f"t::{name}", name, options)

    assert directory("test_x") == golden_dir(root, tmp_path, test_file, "test_x")
    assert directory("test_x", key="k") == golden_dir(root, tmp_path, test_file, "", key="k")
    assert directory("test_x", shared="pol") == shared_golden_dir(root, "pol")
    variant = {"variant": "tp2", "reference": "tp1"}
    reference = golden_dir(root, tmp_path, test_file, "test_x[tp1]")
    assert directory("test_x[tp2]", **variant) == reference  # a variant replays its reference
    assert directory("test_x[tp2]", key="k", **variant) == directory("test_x", key="k")


def test_tolerance_stack_of_a_test():
    from pytest_rollout_golden._internal.tolerance.build import build
    from pytest_rollout_golden._internal.tolerance.stack import Stack

    session = Stack()
    marker = markers.marker_level(
        {"tolerances": {"kl": {"rtol": 0.5, "atol": 0.0}}, "ignore": ["ent"]}
    )
    assert marker[1].source == "@pytest.mark.golden(tolerances=)"

    def stack(options, *, exact):
        return build(markers.declared_tolerances(session, marker, options, exact=exact)).stack

    plain = stack({}, exact=False)
    assert not markers.replays_reference({}) and not plain.exact
    assert plain.resolver().resolve("kl")[1] == "@pytest.mark.golden(tolerances=)"
    assert plain.resolver().resolve("ent")[0].ignore
    assert stack({}, exact=True).exact  # --golden-exact
    assert stack({"exact": True}, exact=False).exact
    variant = {
        "variant": "tp2",
        "reference": "tp1",
        "layout_tolerances": {"pg": {"rtol": 0.1, "atol": 0.0}},
    }
    assert markers.replays_reference(variant)
    found = stack(variant, exact=True)
    assert not found.exact  # a layout variant is never bit-exact, whatever --golden-exact says
    assert found.resolver().resolve("pg")[1] == "variant lane"
    assert found.resolver().resolve("kl")[1] == "@pytest.mark.golden(tolerances=)"
    with pytest.raises(ValueError, match=r"is ignored by @pytest\.mark\.golden"):
        markers.marker_level({"tolerances": {"kl": {"rtol": 0.5, "atol": 0.0}}, "ignore": ["kl"]})


# ---------------------------------------------------------------------- pruning


def _golden(directory: Path) -> Path:
    from pytest_rollout_golden._internal.golden.golden_files import GoldenFiles

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
    result = prune.prune(root, tmp_path, goldens, tests=False)
    assert result.deleted == [gone_file]
    assert not (root / "test_gone").exists()
    assert kept_file.is_dir() and shared.is_dir()
    assert "kept 2 unused golden(s) of test files that still exist" in result.notes[0]
    result = prune.prune(root, tmp_path, goldens[1:], tests=True)
    assert result.deleted == [kept_file, shared] and result.notes == []


def test_prune_keeps_files_it_does_not_own_and_refuses_a_partial_run(tmp_path):
    root = tmp_path / "golden"
    golden = _golden(root / "test_gone" / "test_a")
    (golden / "notes.txt").write_text("mine")
    result = prune.prune(root, tmp_path, [(golden, None)], tests=False)
    assert result.deleted == [golden]  # its files: the directory stays for the user's file
    assert "but kept its directory" in result.notes[0] and "notes.txt" in result.notes[0]
    assert [p.name for p in golden.iterdir()] == ["notes.txt"]  # only the golden's own files
    other = _golden(root / "test_other" / "test_b")
    result = prune.prune(root, tmp_path, [(other, None)], tests=True, refused="tests failed")
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


def _unused_state(tmp_path):
    """Two unused goldens: one of a test file that is gone, one of a file that ran whole."""
    root = tmp_path / "golden"
    gone_file = _golden(root / "test_gone" / "test_a")
    here = _golden(root / "test_here" / "test_b")
    (tmp_path / "test_here.py").write_text("")
    state = SessionState()
    state.expected_dirs.add(str(root / "test_here" / "test_c"))
    state.produced[str(tmp_path / "test_here.py")] = {"test_here.py::test_c"}
    state.selected.add("test_here.py::test_c")
    return root, state, gone_file, here


def test_unused_and_pruned_finds_keeps_and_prunes(tmp_path):
    from pytest_rollout_golden._internal.pytest_plugin.summary import unused_kept_note

    root, state, gone_file, here = _unused_state(tmp_path)
    flags = {"stopped": False, "failed": False, "partial": ""}
    found = prune.unused_and_pruned(
        state, root, tmp_path, prune_gone=False, prune_tests=False, **flags
    )
    assert (found.goldens, found.kept, found.pruned.deleted) == ([gone_file, here], 1, [])
    assert found.notes() == [unused_kept_note(1)]
    assert gone_file.is_dir()  # nothing deleted without --golden-prune
    refused = prune.unused_and_pruned(
        state,
        root,
        tmp_path,
        prune_gone=True,
        prune_tests=False,
        stopped=True,
        failed=False,
        partial="",
    )
    assert refused.notes() == [
        "--golden-prune skipped: the session stopped early; nothing was deleted"
    ]
    pruned = prune.unused_and_pruned(
        state, root, tmp_path, prune_gone=True, prune_tests=False, **flags
    )
    assert pruned.pruned.deleted == [gone_file] and not gone_file.exists() and here.is_dir()
    assert "kept 1 unused golden(s) of test files that still exist" in pruned.notes()[0]
    assert len(pruned.notes()) == 1  # the kept-note of a run without pruning is not repeated


def test_unused_and_pruned_looks_for_nothing_without_expected_goldens_or_pruning(tmp_path):
    root, state, _, _ = _unused_state(tmp_path)
    state.expected_dirs.clear()
    found = prune.unused_and_pruned(
        state,
        root,
        tmp_path,
        prune_gone=False,
        prune_tests=False,
        stopped=False,
        failed=False,
        partial="",
    )
    assert (found.goldens, found.kept, found.notes()) == ([], 0, [])


def test_rank_snapshot_copies_each_golden_asked_for_once(tmp_path, monkeypatch):
    from pytest_rollout_golden._internal.pytest_plugin.snapshot import RankSnapshot

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    root = tmp_path / "golden"
    asked = _golden(root / "test_a" / "t")
    _golden(root / "test_a" / "t" / "nested")
    _golden(root / "test_b" / "u")
    snapshot = RankSnapshot(root, 3)
    assert snapshot.path.name.startswith(location.rank_snapshot_prefix(3))
    copy = snapshot.copy_of(asked)
    assert copy == snapshot.path / "test_a" / "t"
    wanted = [p.name for p in asked.iterdir() if p.is_file() and not p.name.startswith(".")]
    assert sorted(p.name for p in copy.iterdir()) == sorted(wanted)
    assert location.MANIFEST in wanted
    (asked / location.MANIFEST).write_text("changed")
    assert snapshot.copy_of(asked) == copy
    assert (copy / location.MANIFEST).read_text() != "changed"  # copied once, as first seen
    assert not snapshot.copy_of(root / "test_c" / "v").exists()  # not recorded
    assert not (snapshot.path / "test_b").exists()
    snapshot.remove()
    assert list((tmp_path / "temp").iterdir()) == []


def test_write_report_writes_the_document_or_names_the_remedy(tmp_path):
    from pytest_rollout_golden._internal.pytest_plugin.session import write_report
    from pytest_rollout_golden.errors import GoldenError

    path = tmp_path / "reports" / "r.json"
    write_report(path, SessionState(), mode="auto", unused=[tmp_path / "u"], pruned=[])
    document = json.loads(path.read_text())
    assert (document["mode"], document["unused"]) == ("auto", [str(tmp_path / "u")])
    (tmp_path / "file").write_text("")
    with pytest.raises(GoldenError, match=r"NOT written .*name another file"):
        write_report(
            tmp_path / "file" / "r.json", SessionState(), mode="auto", unused=[], pruned=[]
        )


def test_plot_failure_draws_only_a_golden_that_compared_metrics(tmp_path):
    from pytest_rollout_golden._internal.report.plot import plot_failure

    tensors_only = {"comparisons": [{"kind": "tensor", "metric": "f/x", "verdict": "fail"}]}
    assert plot_failure(tensors_only, tmp_path, "t.py::t") is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"tolerances": {"pg_loss": 1e-3}}, "'pg_loss': expected a Tolerance or a dict, got float"),
        ({"tolerances": [("loss", 1)]}, "takes METRIC:rtol=R,atol=A strings, got ('loss', 1)"),
        ({"exact": "no"}, "exact= must be True or False, got 'no'"),
        ({"deterministic": 0}, "deterministic= must be True or False, got 0"),
        ({"regenerate": "yes"}, "regenerate= must be True or False, got 'yes'"),
        ({"key": 3}, "key= must be a non-empty string, got 3"),
        ({"ignore": [None]}, "takes metric or tensor names, got None"),
    ],
)
def test_marker_arguments_of_the_wrong_type_are_refused_naming_the_fix(options, problem):
    with pytest.raises((OptionError, ValueError)) as exc:
        markers.marker_level(markers.marker_options([((), options)], "t.py::test_x"))
    assert problem in str(exc.value)


def test_a_marker_mistake_is_a_usage_error_not_a_traceback(project):
    project.write(
        "import pytest\n@pytest.mark.golden(tolerances={'pg_loss': 1e-3})\n"
        "def test_x(golden):\n    golden.check({'pg_loss': 1.0})\n"
    )
    result = project.run()
    text = result.stdout.str() + result.stderr.str()
    assert "expected a Tolerance or a dict, got float" in text
    assert "Traceback" not in text and "tolerance.py" not in text


def test_stale_rank_copy_cleanup_touches_only_real_folders_with_the_exact_marker(tmp_path):
    """Only an abandoned folder holding the plugin's own marker goes: a link named like a copy,
    a linked, FIFO or edited marker, and a folder without one all stay, with what they hold."""
    marker, text = location.RANK_SNAPSHOT_MARKER, location.RANK_SNAPSHOT_MARKER_TEXT

    def copy(suffix: str) -> Path:
        folder = tmp_path / (location.rank_snapshot_prefix(1, pid=999999) + suffix)
        folder.mkdir()
        (folder / "data.txt").write_text("keep")
        return folder

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / marker).write_text(text)
    abandoned = copy("abandoned")
    (abandoned / marker).write_text(text)
    linked_folder = tmp_path / (location.rank_snapshot_prefix(1, pid=999999) + "link")
    linked_folder.symlink_to(elsewhere, target_is_directory=True)
    linked_marker = copy("linkedmarker")
    (linked_marker / marker).symlink_to(elsewhere / marker)
    fifo = copy("fifo")
    os.mkfifo(fifo / marker)
    edited = copy("edited")
    (edited / marker).write_text(text + "mine\n")
    unmarked = copy("my_notes")

    assert rank_snapshots.remove_stale(tmp_path) == [abandoned]
    assert not abandoned.exists()
    for kept in (linked_marker, fifo, edited, unmarked):
        assert (kept / "data.txt").read_text() == "keep"
    assert linked_folder.is_symlink() and (elsewhere / marker).read_text() == text
