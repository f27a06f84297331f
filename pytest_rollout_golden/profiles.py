"""Hypothesis settings profiles ``ci`` and ``dev`` for property tests of RL numerics.

Select one with ``pytest --hypothesis-profile=ci``. ``ci`` is derandomized so a
CI run is reproducible; ``dev`` explores fewer examples for a fast local loop.
"""

from __future__ import annotations


def register_profiles() -> None:
    """Register the ``ci`` and ``dev`` profiles (idempotent)."""
    from hypothesis import HealthCheck, settings

    common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
    settings.register_profile("ci", max_examples=50, derandomize=True, print_blob=True, **common)
    settings.register_profile("dev", max_examples=25, **common)
