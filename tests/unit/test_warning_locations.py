"""A golden's warnings point at the user's line, whichever of its methods warns."""

from __future__ import annotations

import inspect
import warnings

from pytest_rollout_golden import Golden, GoldenNaNWarning, GoldenToleranceWarning
from pytest_rollout_golden._internal.tolerance.spec import Layer


def test_check_and_finish_warn_at_the_line_that_called_them(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recording = Golden(tmp_path / "g", test_id="t")
        recording.check({"loss": 1.0}, tolerances={"nomatch": {"rtol": 0.1}})
        check_line = _line()
        recording.check({"kl": float("nan")}, step=1)
        nan_line = _line()
        recording.finish()
        replay = Golden(tmp_path / "g", test_id="t", tolerances={"kl": {"equal_nan": True}})
        replay.check({"loss": 1.0})
        replay.check({"kl": float("nan")}, step=1)
        replay.finish(tolerance_layers=[Layer("layer", {"unused": {"rtol": 0.1}})])
        finish_line = _line()
    found = [(w.category, w.filename, w.lineno) for w in caught]
    assert found == [
        (GoldenToleranceWarning, __file__, check_line - 1),
        (GoldenNaNWarning, __file__, nan_line - 1),
        (GoldenToleranceWarning, __file__, finish_line - 1),
    ]


def _line() -> int:
    """The line that called this."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_check_scores_warns_at_the_line_that_called_it(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        golden = Golden(tmp_path / "g", test_id="t")
        golden.check_scores([1.0, 2.0], tolerances={"nomatch": {"rtol": 0.1}})
        scores_line = _line()
        golden.check_scores([1.0, float("nan")], step=1)
        nan_line = _line()
        golden.finish()
    found = [(w.category, w.filename, w.lineno) for w in caught]
    assert found == [
        (GoldenToleranceWarning, __file__, scores_line - 1),
        (GoldenNaNWarning, __file__, nan_line - 1),
    ]
