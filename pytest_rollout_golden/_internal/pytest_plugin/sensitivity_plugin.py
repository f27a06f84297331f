"""``--golden-sensitivity``: what each gate of each golden can detect, and a floor to require.

Registered only when ``--golden-sensitivity``, ``--golden-sensitivity-require`` or ini
``golden_sensitivity_require`` is given. Once a golden test finished (passed, or failed on its
values), its golden's gates are probed (:mod:`..golden.sensitivity`: no test body runs
again); the controller prints them in the summary and, below a required floor, fails the
session naming each gate that cannot detect it.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..golden.sensitivity import Gate, below_floor, floor_lines, gate_lines
from ..wording import display
from .golden_plugin import GoldenPlugin, as_usage_error
from .options import sensitivity_floor

HEADER = (
    "golden sensitivity: the smallest relative change of each gated value that fails it "
    "(probed at its first and last recorded steps)"
)


class SensitivityPlugin:
    """Probes each finished golden's gates; reports them, and enforces the floor."""

    def __init__(self, core: GoldenPlugin):
        self.core = core
        config = core.config
        with as_usage_error():
            self.floor, self.source = sensitivity_floor(
                config.option.golden_sensitivity_require,
                config.getini("golden_sensitivity_require"),
            )
        core.finishers.append(self.sample)
        core.keep_probes = True

    def sample(self, item: pytest.Item, golden: Any, error: bool) -> None:
        """Probe the gates of a golden whose test ran through (a test that raised checked
        only part of them: none are probed)."""
        if error:
            return
        gates = golden.sensitivity()
        if gates:
            where = display(golden.directory, self.core.rootdir)
            found = {"golden": where, "gates": [g.to_json() for g in gates]}
            self.core.state.sensitivity[item.nodeid] = found

    def below(self) -> list[tuple[str, Gate]]:
        """``(test, gate)`` of each gate below the floor (none without one)."""
        if self.floor is None:
            return []
        return [
            (test, gate)
            for test, gates in sorted(self._gates().items())
            for gate in below_floor(gates, self.floor)
        ]

    def _gates(self) -> dict[str, list[Gate]]:
        return {
            test: [Gate.from_json(g) for g in found["gates"]]
            for test, found in self.core.state.sensitivity.items()
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session end (the controller's, after the workers' states merged): a gate below the
        floor fails a session that would otherwise pass."""
        if self.core.is_worker or not self.below():
            return
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Summary: the ``golden sensitivity`` section, each golden's gates."""
        if self.core.is_worker:
            return
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "golden sensitivity")
        gates = self._gates()
        if not gates:
            write("no golden finished its checks in this session: nothing to probe")
        else:
            write(HEADER)
        for test, found in sorted(gates.items()):
            write(f"{test} ({self.core.state.sensitivity[test]['golden']})")
            for line in gate_lines(found):
                write(line)
        below = self.below()
        if below:
            assert self.floor is not None
            for line in floor_lines(below, self.floor, self.source):
                write(line, red=True)
        elif self.floor is not None:
            write(f"every gate detects a relative change of {self.floor:g} ({self.source})")
