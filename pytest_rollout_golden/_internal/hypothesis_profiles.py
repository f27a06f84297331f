"""Hypothesis settings profiles ``rollout-golden-ci`` and ``rollout-golden-dev`` for property
tests of RL numerics.

Select one with ``pytest --hypothesis-profile=rollout-golden-ci``. The CI profile is
derandomized so a CI run is reproducible; the dev profile explores fewer examples for a fast
local loop. Profiles are registered under these names only, and never over a profile of the
same name that already exists: a user's own ``ci`` or ``dev`` profile, and hypothesis'
built-in ``ci``, stay as they are.
"""

from __future__ import annotations

CI, DEV = "rollout-golden-ci", "rollout-golden-dev"
NAMES = (CI, DEV)


def register_profiles() -> None:
    """Register the project's profiles where no profile of their name exists (idempotent)."""
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
    wanted = {
        CI: {"max_examples": 50, "derandomize": True, "print_blob": True, **common},
        DEV: {"max_examples": 25, **common},
    }
    for name, options in wanted.items():
        try:
            settings.get_profile(name)
        except InvalidArgument:
            settings.register_profile(name, **options)
