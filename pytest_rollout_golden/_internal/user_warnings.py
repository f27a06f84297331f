"""Warnings shown at the user's line: the first caller outside this package, however many of
the package's frames (wrappers, the golden's run, its checks) lie between."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn_user(warning: Warning) -> None:
    """Warn ``warning`` at the nearest frame above this call that is not the package's."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level)
