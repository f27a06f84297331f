"""The settings a golden test runs under: deterministic (ini ``golden_deterministic``,
``--golden-deterministic``, the marker's ``deterministic=``) with its seed, and float64 as the
default dtype of the float64 oracle's run.

Registered in every session: any test's marker may ask for them. They are entered into the
test's ``SETTINGS`` stack at setup, before its first fixture; the core closes it at teardown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from .golden_plugin import DETERMINISM, SETTINGS, GoldenPlugin, as_usage_error
from .options import parse_seed

# The settings plugin of the session, for the ``deterministic`` fixture.
SETTINGS_PLUGIN = pytest.StashKey["SettingsPlugin"]()


class SettingsPlugin:
    """Enters a golden test's deterministic and float64 settings at its setup."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        opt = core.config.option
        self.deterministic = (
            opt.golden_deterministic
            if opt.golden_deterministic is not None
            else core.config.getini("golden_deterministic")
        )

    def wants_determinism(self, item: pytest.Item) -> bool:
        if "golden" not in getattr(item, "fixturenames", ()):
            return False
        return bool(self.core.marker_options(item).get("deterministic", self.deterministic))

    def seed_of(self, item: pytest.Item) -> int:
        options = self.core.marker_options(item)
        if "seed" not in options:
            return self.core.seed
        with as_usage_error():
            return parse_seed(options["seed"], f"{item.nodeid}: golden marker seed=", text=False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        """Setup (outermost): the deterministic settings, before the test's first fixture.

        They are entered into the test's ``SETTINGS`` stack, which the calibration plugin's
        perturbations join and teardown closes.
        """
        stack = item.stash[SETTINGS] = contextlib.ExitStack()
        mistake = None
        try:
            if item.get_closest_marker("golden") is not None:
                self.core.marker_options(item)  # every mistake of the marker, whatever the fixtures
            wanted = self.wants_determinism(item)
            seed = self.seed_of(item) if wanted else None
        except pytest.UsageError as exc:  # the test errors with it; raised after the yield:
            wanted, mistake = False, exc  # other plugins' teardown expects their setup to run
        if wanted:
            from ..golden.determinism import deterministic

            stack.enter_context(deterministic(seed))
            item.stash[DETERMINISM] = stack  # the deterministic fixture then has nothing to do
        if mistake is None and self.core.is_oracle(item) and "golden" in item.fixturenames:
            from ..golden.precision import ORACLE, default_dtype

            stack.enter_context(default_dtype(ORACLE))  # a model the fixtures build: float64
        result = yield
        if mistake is not None:
            raise mistake
        return result
