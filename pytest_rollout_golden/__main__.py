"""``python -m pytest_rollout_golden``: the ``rollout-golden`` command line."""

import sys

from .cli import main

sys.exit(main())
