"""Option mistakes name the fix: a marker's mistakes, all at once, as its test's error
(unknown keywords with a close match, tolerance fields, positional arguments, a text seed);
a bad ini missing-step policy, which stops the run at start-up; and a --golden-tolerance
that matched nothing, with the name it was probably meant for."""

from __future__ import annotations

import pytest

from pytest_rollout_golden._internal.pytest_plugin import markers, options
from pytest_rollout_golden._internal.pytest_plugin.options import OptionError


def test_an_unknown_marker_keyword_lists_the_options_and_the_close_one():
    with pytest.raises(OptionError) as raised:
        markers.marker_options([((), {"tolerance": {}})], "t.py::test")
    message = str(raised.value)
    assert "t.py::test: @pytest.mark.golden: unknown option tolerance=" in message
    assert "did you mean 'tolerances'?" in message
    assert "missing_step" in message and "shared" in message  # the known ones are listed


def test_every_mistake_of_a_marker_is_reported_at_once_with_its_fix():
    with pytest.raises(OptionError) as raised:
        markers.marker_options(
            [(("lp_golden",), {"rtol": 1e-3}), ((), {"toleranse": {}, "seed": "1"})],
            "t.py::test",
        )
    lines = str(raised.value).splitlines()
    assert lines[0] == "t.py::test: 4 mistakes in @pytest.mark.golden:"
    assert lines[1:4] == [
        "  - 'lp_golden' is given positionally, but the marker takes keywords only: "
        "pass it as key='lp_golden'",
        "  - rtol= belongs to a metric's tolerance, not to the marker: "
        "tolerances={'pg_loss': {'rtol': 0.001}} (a metric name, or a glob like 'actor/*')",
        "  - unknown option toleranse= (did you mean 'tolerances'?); the options are "
        + ", ".join(sorted(markers.MARKER_OPTIONS)),
    ]
    assert lines[4] == "  - seed= must be an integer in [0, 2**32), got '1'"


MARKER_MISTAKES = """
import pytest


@pytest.mark.golden("lp", rtol=1e-3, atol=1e-6, seed=-1)
def test_bad(golden):
    golden.check({"x": 1.0})


@pytest.mark.golden(exact="yes")
def test_bad_without_golden(deterministic):
    pass


def test_good(golden):
    golden.check({"x": 1.0})
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_a_marker_mistake_errors_its_test_and_the_session_goes_on(project, monkeypatch, xdist):
    project.write(MARKER_MISTAKES)
    monkeypatch.setenv("COLUMNS", "200")  # the short summary's lines untrimmed
    result = project.run_subprocess("-n", "2", "-rE") if xdist else project.run("-rE")
    result.assert_outcomes(passed=1, errors=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "UsageError: test_it.py::test_bad: 3 mistakes in @pytest.mark.golden:",
            "  - 'lp' is given positionally, * pass it as key='lp'",
            "  - rtol=, atol= belong to a metric's tolerance, not to the marker: "
            "tolerances={'pg_loss': {'rtol': 0.001, 'atol': 1e-06}} *",
            "  - seed= must be an integer in [[]0, 2**32), got -1",
        ]
    )
    result.stdout.fnmatch_lines(
        ["UsageError: test_it.py::test_bad_without_golden: @pytest.mark.golden: exact= must *"]
    )
    summary = [x for x in result.outlines if x.startswith("ERROR test_it.py::test_bad ")]
    assert summary == [
        "ERROR test_it.py::test_bad - UsageError: test_it.py::test_bad: 3 mistakes in "
        "@pytest.mark.golden:"
    ]
    assert "def marker_options" not in result.stdout.str()  # the message, not our traceback
    assert project.golden_dir("test_good").is_dir()
    assert not project.golden_dir("test_bad").exists()


def test_a_marker_seed_given_as_text_is_refused_while_the_ini_text_is_read():
    with pytest.raises(OptionError, match="an integer"):
        options.parse_seed("1", "t.py::test: golden marker seed=", text=False)
    assert options.parse_seed("1", "ini golden_seed") == 1


def test_a_bad_ini_missing_step_policy_stops_the_run_at_start_up(project):
    project.write("def test_a(golden):\n    pass\n\ndef test_b(golden):\n    pass\n")
    project.pytester.makeini("[pytest]\ngolden_missing_step = repaet\n")
    result = project.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini golden_missing_step= must be one of record, error, repeat, generate*'repaet'*"]
    )
    assert "test_a" not in result.stdout.str()  # no test ran, none errored one by one


def test_the_missing_step_help_names_one_default(project):
    help_text = " ".join(project.run("--help").stdout.str().split())
    start = help_text.index("--golden-missing-step")
    described = help_text[start : help_text.index("--golden-strict", start)]
    assert described.count("default") == 1, described


def test_an_unmatched_tolerance_suggests_the_checked_name(project):
    project.write("def test_it(golden):\n    golden.check({'grad_norm': 1.0, 'pg_loss': 0.5})\n")
    result = project.run("--golden-tolerance", "gradnorm:rtol=1e-2")
    result.stdout.fnmatch_lines(
        [
            "tolerances that matched no metric:",
            "*--golden-tolerance 'gradnorm'*did you mean 'grad_norm'?*",
        ]
    )


def test_an_unmatched_tolerance_suggests_across_xdist_workers(project):
    project.write(
        "def test_it(golden):\n    golden.check({'grad_norm': 1.0})\n\n"
        "def test_other(golden):\n    golden.check({'pg_loss': 0.5})\n"
    )
    result = project.run_subprocess("-n", "2", "--golden-tolerance", "gradnorm:rtol=1e-2")
    result.stdout.fnmatch_lines(["*--golden-tolerance 'gradnorm'*did you mean 'grad_norm'?*"])


def test_a_missing_golden_under_ci_is_headlined_missing_with_one_remedy(project, monkeypatch):
    project.write("def test_it(golden):\n    golden.check({'loss': 1.0, 'kl': 0.0})\n")
    monkeypatch.setenv("CI", "true")
    result = project.run()
    out = result.stdout.str()
    assert "golden mismatch" not in out
    result.stdout.fnmatch_lines(["*golden missing: no golden exists yet*loss*kl*"])
    failure = out.split("FAILURES")[1].split("rollout golden")[0]
    assert failure.count("--update-golden") == 1, failure


def test_a_missing_golden_names_the_golden_of_the_project_root(pytester, monkeypatch):
    """`cd tests && CI=true pytest` without a config file: rootdir is tests/, and the golden
    the project holds is ../golden."""
    monkeypatch.delenv("CI", raising=False)  # the first run records
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_it.py").write_text(
        "def test_it(golden):\n    golden.check({'loss': 1.0})\n"
    )
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", "tests").ret == 0
    assert (pytester.path / "golden").is_dir()
    monkeypatch.chdir(pytester.path / "tests")
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rootdir", ".")
    assert result.ret == 1
    here, there = pytester.path / "tests" / "golden", pytester.path / "golden"
    result.stdout.fnmatch_lines([f"*no golden under {here}*{there} exists*"])
