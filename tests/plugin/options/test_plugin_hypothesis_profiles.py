"""The plugin's hypothesis profiles live under its own names and never replace a user's."""

from __future__ import annotations

import pytest

COUNTING_TEST = """
from hypothesis import given, strategies as st

CALLS = []


@given(st.integers())
def test_counted(x):
    CALLS.append(x)


def test_report():
    print(f"EXAMPLES={len(CALLS)}")
"""


@pytest.mark.parametrize("name", ["ci", "dev"])
def test_a_users_profile_of_a_common_name_keeps_its_settings(pytester: pytest.Pytester, name):
    pytester.makeconftest(
        "from hypothesis import settings\n"
        f"settings.register_profile({name!r}, max_examples=7, derandomize=True)\n"
    )
    pytester.makepyfile(test_counting=COUNTING_TEST)
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", f"--hypothesis-profile={name}"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*EXAMPLES=7*"])


def test_the_projects_profile_is_selectable(pytester: pytest.Pytester):
    pytester.makepyfile(test_counting=COUNTING_TEST)
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", "--hypothesis-profile=rollout-golden-dev"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*EXAMPLES=25*"])
